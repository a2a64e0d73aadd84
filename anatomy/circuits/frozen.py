"""The parts of a block with the prompt's non-linear quantities frozen: norms and attention, as linear maps.

Shape letters: T positions, E d_model, H query heads, K key/value heads, D d_head, R rows (targets) whose
gradients travel together, P the positions a row can reach (its own and earlier ones).

Frozen at the values one prompt gives them (Ameisen et al. 2025, "Circuit Tracing", section 2.2):

    a norm              norm(x)[q] = centre(x[q]) s[q] g + beta      s[q] = 1 / sqrt(mean(centre(x)^2) + eps)
                                                                     (layers.norm_parts; centre: a LayerNorm's)
    attention           attn(x)[p] = sum_h sum_q A_h[p, q] (x[q] W_V^h) W_O^h      A: this prompt's patterns

Each is linear but for its biases (beta, b_V, b_O): `forward(x, constant=False)` is the linear part. A
sublayer is attention between the norms its block puts around it (blocks.py): a norm before it (pre-norm,
sandwich, parallel blocks), a norm on its output (sandwich, OLMo 2's post-sublayer norms), either, both or
none; its transpose carries rows of gradients back from its output to its input.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..layers import LayerNorm, RMSNorm, norm_parts


class FrozenNorm:
    """A norm with its scale frozen at x [T, E]: x -> centre(x) s[q] g (+ beta); linear but for beta.

    gain=False: the norm's stream before its gain and bias (its `normalized` point, TransformerLens's
    hook_normalized): x -> centre(x) s[q]."""

    def __init__(self, norm: nn.Module, x: torch.Tensor, *, gain: bool = True):
        parts = norm_parts(norm, x)
        self.gain = parts.gain.float() if gain else torch.ones_like(parts.gain, dtype=torch.float32)  # (E,)
        self.bias = None if parts.bias is None or not gain else parts.bias.float()
        self.centred, self.scale = parts.centred, parts.scale  # scale (T,)

    @classmethod
    def identity(cls, d_model: int, length: int, device: torch.device | str = "cpu") -> "FrozenNorm":
        """The map x -> x, where a block has no norm (OLMo 2's attention reads the stream itself)."""
        norm = cls.__new__(cls)
        norm.gain, norm.bias, norm.centred = torch.ones(d_model, device=device), None, False
        norm.scale = torch.ones(length, device=device)
        return norm

    def before_gain(self) -> "FrozenNorm":
        """The same norm up to its `normalized` point: x -> centre(x) s[q], no gain, no bias."""
        norm = FrozenNorm.__new__(FrozenNorm)
        norm.gain, norm.bias, norm.centred, norm.scale = torch.ones_like(self.gain), None, self.centred, self.scale
        return norm

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """[T', E] (positions 0 ..) -> centre(x) s[q], the stream before the gain."""
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        return x * self.scale[: x.size(0), None]

    def forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T', E] (positions 0 ..) -> [T', E]; constant=False leaves beta out (the linear part alone)."""
        y = self.normalize(x) * self.gain
        return y + self.bias if constant and self.bias is not None else y

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[n, ..., E] vectors, each row at its own position [n] -> their images, the linear part."""
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        scale = self.scale[positions].view(-1, *[1] * (x.dim() - 1))  # (n, 1, ..., 1)
        return x * (scale * self.gain)

    def transpose_at(self, g: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """[k, E] reading vectors at one position (or each at its own, position [k]) -> their gradients there,
        centre(g gain) s[q] (the centring is its own transpose)."""
        scale = self.scale[position]
        g = g * ((scale[:, None] if scale.dim() else scale) * self.gain)
        return g - g.mean(dim=-1, keepdim=True) if self.centred else g

    def transpose(self, g: torch.Tensor, first: int = 1) -> None:
        """g [r, P, E] rows' gradients at positions first .. first + P - 1, carried back through the norm in place."""
        P = g.size(1)
        g.mul_(self.scale[first:first + P].view(1, P, 1) * self.gain)
        if self.centred:
            g.sub_(g.mean(dim=-1, keepdim=True))

    def fold(self, w: torch.Tensor) -> torch.Tensor:
        """w [., E], a map read at the norm's output -> w diag(g) C, the same read at its input but for s[q]."""
        w = w * self.gain
        return w - w.mean(dim=-1, keepdim=True) if self.centred else w

    def fold_rows(self, w: torch.Tensor) -> torch.Tensor:
        """w [E, .], a map from the norm's output -> diag(g) C w, the gradient's map at its input but for s[q]."""
        w = w - w.mean(dim=0, keepdim=True) if self.centred else w
        return w * self.gain[:, None]


def stream_norms(model: nn.Module) -> list[nn.Module]:
    """The norms of the residual stream (before, on and after the sublayers, after the embeddings, the final one):
    every LayerNorm and RMSNorm of `model` but the per-head q/k norms, which only shape the patterns."""
    return [m for m in model.modules() if isinstance(m, (LayerNorm, RMSNorm)) and m.out.axes == ("batch", "pos", "d_model")]


@contextmanager
def recording_norm_inputs(model: nn.Module) -> Iterator[dict]:
    """{norm: its input [B, T, E]} of every stream norm, filled by the pass run inside (the input of a norm after a
    residual sum, or after the embeddings, is no trace point)."""
    inputs: dict = {}
    handles = [norm.register_forward_pre_hook(lambda module, args: inputs.__setitem__(module, args[0]))
               for norm in stream_norms(model)]
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def norms_frozen(frozen: dict) -> Iterator[None]:
    """Inside, each norm module in `frozen` ({norm: FrozenNorm}) computes its frozen form of a batch of one, through
    its own trace points (normalized, then out), so that what reads them (a transcoder) sees the frozen values."""
    def forward_of(norm: nn.Module, f: FrozenNorm):
        def forward(x: torch.Tensor) -> torch.Tensor:  # (1, T, E)
            normalized = norm.normalized(f.normalize(x[0].float())[None].to(x.dtype))
            out = normalized[0].float() * f.gain + (0.0 if f.bias is None else f.bias)
            return norm.out(out[None].to(x.dtype))
        return forward

    for norm, f in frozen.items():
        norm.forward = forward_of(norm, f)
    try:
        yield
    finally:
        for norm in frozen:
            del norm.forward


KEY_BLOCK = 64  # keys mixed in one product: each block skips the queries that cannot see it (the causal mask)
LOW_PRODUCT_ROWS = 4096  # rows of one bfloat16 product at most: oneDNN (PyTorch's CPU kernels for them) keeps the
# kernels of the shapes it multiplied (anatomy/__init__.py), each with scratch memory in proportion to its rows (10 MB
# at 28,672 rows, 0.03 MB at 4,096)


def rows_product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [n, b] = x [n, a] @ w [a, b]; in float32 one product, in a lower dtype pieces of LOW_PRODUCT_ROWS rows."""
    if x.dtype == torch.float32:
        return torch.mm(x, w, out=out)
    for start in range(0, x.size(0), LOW_PRODUCT_ROWS):
        torch.mm(x[start:start + LOW_PRODUCT_ROWS], w, out=out[start:start + LOW_PRODUCT_ROWS])
    return out


class Scratch:
    """The buffers of the transposes' temporaries, kept between calls and shared by a prompt's sublayers (one
    call runs at a time): a bucket's temporaries are tens of MB each, and made afresh for every call they cost a
    page fault per page (a sixth of a 256-token graph's CPU time was the system's; kept, its 240 CPU s became
    203)."""

    def __init__(self):
        self.buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of `shape` for the temporary `name`, in its buffer (grown when too small)."""
        size = math.prod(shape)
        buffer = self.buffers.get((name, dtype))
        if buffer is None or buffer.numel() < size or buffer.device != device:
            self.buffers.pop((name, dtype), None)  # let the old one go before the new one is made
            buffer = self.buffers[(name, dtype)] = torch.empty(size, dtype=dtype, device=device)
        return buffer[:size].view(shape)


class FrozenAttention:
    """One attention layer with its patterns frozen: attn(x)[p] = sum_h sum_q A_h[p, q] (x[q] W_V^h) W_O^h.

    Reads x after the sublayer's norm (FrozenNorm does that part)."""

    def __init__(self, attention: nn.Module, pattern: torch.Tensor):
        self.pattern = pattern.float()  # (H, T, T)
        self.n_heads, self.n_kv, self.d_head = attention.n_heads, attention.n_kv_heads, attention.d_head
        self.w_v = attention.v_proj.weight.detach().float()  # (K*D, E): v = x W_v^T
        self.b_v = None if attention.v_proj.bias is None else attention.v_proj.bias.detach().float()
        self.w_o = attention.o_proj.weight.detach().float()  # (E, H*D): out = z W_o^T
        self.b_o = None if attention.o_proj.bias is None else attention.o_proj.bias.detach().float()
        self.group = self.n_heads // self.n_kv

    def forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] (normed, positions 0 ..) -> [T, E]; constant=False leaves the biases out."""
        T = x.size(0)
        v = x @ self.w_v.T  # (T, K*D)
        if constant and self.b_v is not None:
            v = v + self.b_v
        v = v.view(T, self.n_kv, self.d_head).repeat_interleave(self.group, dim=1)  # (T, H, D)
        z = torch.einsum("hpq,qhd->phd", self.pattern[:, :T, :T], v)  # (T, H, D)
        out = z.reshape(T, -1) @ self.w_o.T  # (T, E)
        return out + self.b_o if constant and self.b_o is not None else out


class FrozenSublayer:
    """One attention sublayer of the replacement, x -> out_norm(attn(norm(x))), with the patterns and both norms'
    scales frozen (either norm may be the identity), and its transpose for rows of gradients.

    Carried back, a row's gradient g at query positions p goes to key positions q as

        u = s'[p] g (gain' C') W_o                   per head: the output norm, then W_o   [r, P, H, D]
        dv[q] = s[q] sum_h sum_p A_h[p, q] u_h[p]     its heads' share of each key/value group
        dx[q] = dv[q] (W_v gain C)                   gain: the input norm's gain, C its centring (a LayerNorm)

    with the gains and centrings folded into W_o and W_v once (w_out_back, w_back) and the output norm's s'[p]
    into the patterns (pattern_back), so that the norms cost a scale on the narrow side (K D) only, and dx is
    added to g in place (the residual: x + attn(norm(x))).

    products: the dtype of the three products of a dense row's transpose (u, the heads' mixing, dv W_v), float32
    or bfloat16. In bfloat16 each product accumulates in float32 and rounds its output to 8 bits of mantissa:
    what attention adds to g carries about 0.5% relative error, g itself stays float32 (the residual sum), and
    CPUs with bfloat16 instructions (avx512_bf16, AMX) and GPUs run the products 3x faster."""

    def __init__(self, norm: FrozenNorm, attention: nn.Module, pattern: torch.Tensor, out_norm: FrozenNorm | None = None,
                 products: torch.dtype = torch.float32, scratch: Scratch | None = None):
        self.norm, self.out_norm = norm, out_norm
        self.scratch = Scratch() if scratch is None else scratch
        self.attention = FrozenAttention(attention, pattern)
        self.w_back = norm.fold(self.attention.w_v)  # (K*D, E)
        a = self.attention
        self.w_out_back = a.w_o if out_norm is None else out_norm.fold_rows(a.w_o)  # (E, H*D)
        T = a.pattern.size(1)
        self.pattern_back = a.pattern if out_norm is None else a.pattern * out_norm.scale[None, :T, None]  # (H, T, T)
        self.products = products
        # the dense transpose's weights in the products' dtype (the same tensors in float32; the patterns are cast
        # where each product lays them out, `mixing`)
        self.w_out_low, self.w_back_low, self.scale_low = (t.to(products) for t in (self.w_out_back, self.w_back, norm.scale))

    def forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] (positions 0 ..) -> [T, E]: out_norm(attn(norm(x))); constant=False leaves every bias out."""
        out = self.attention.forward(self.norm.forward(x, constant), constant)
        return out if self.out_norm is None else self.out_norm.forward(out, constant)

    def add_transpose(self, g: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """g [r, P, E] (contiguous) rows' gradients at query positions 1 .. P: add what this sublayer carries
        back to positions 1 .. P in place, and return [r] what it carries to position 0, dotted with
        `image` [E] (the first token's image there)."""
        a = self.attention
        r, P, E = g.shape
        K, D, keys, low = a.n_kv, a.d_head, P + 1, self.products
        take = lambda name, *shape: self.scratch.take(name, shape, low, g.device)  # noqa: E731
        x = g.view(r * P, E) if low == g.dtype else take("x", r * P, E).copy_(g.view(r * P, E))  # (r P, E)
        u = rows_product(x, self.w_out_low, take("u", r * P, a.n_heads * D))  # (r P, H D)
        by_key = take("by key", K, P * a.group, r * D)  # (K, P group, r D): queries, then a group's heads
        by_key.view(K, P, a.group, r, D).copy_(u.view(r, P, K, a.group, D).permute(2, 1, 3, 0, 4))
        # sum over a group's heads and its queries at once: one contraction over (query, head) per group. The mask
        # is causal: key q hears queries q .. P only, so each block of keys skips the queries before it
        mixing = self.mixing(P)  # (K, keys, P group)
        mixed = take("mixed", K, keys, r * D)
        for k0 in range(0, keys, KEY_BLOCK):
            heard = (max(k0, 1) - 1) * a.group  # the first (query, head) these keys hear
            torch.bmm(mixing[:, k0:k0 + KEY_BLOCK, heard:], by_key[:, heard:], out=mixed[:, k0:k0 + KEY_BLOCK])  # (K, block, r D)
        return self.add_keys(g, mixed.view(K, keys, r, D), image)

    def mixing(self, P: int) -> torch.Tensor:
        """[K, keys, P group]: s'[p] A_h[p, q] for key q, laid out so that one product sums a group's heads and
        queries 1 .. P (made for each call in the scratch's one buffer, not kept per P: a long prompt has many P,
        each P^2 H floats)."""
        a = self.attention
        pattern = self.pattern_back[:, 1:P + 1, :P + 1].reshape(a.n_kv, a.group, P, P + 1)  # (K, group, P, keys)
        mixing = self.scratch.take("mixing", (a.n_kv, P + 1, P * a.group), self.products, pattern.device)
        mixing.view(a.n_kv, P + 1, P, a.group).copy_(pattern.permute(0, 3, 2, 1))  # (K, keys, P, group), cast in the copy
        return mixing

    def add_transpose_at(self, g: torch.Tensor, image: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """add_transpose for rows whose gradient is still at their own position alone (they joined at this
        layer): P for every row, or positions [r] (1 .. P) one each; W_o is applied there only."""
        a = self.attention
        r, P, E = g.shape
        H, K, D, keys = a.n_heads, a.n_kv, a.d_head, P + 1
        if positions is None:
            positions = torch.full((r,), P, device=g.device)
        u = (g[torch.arange(r, device=g.device), positions - 1] @ self.w_out_back).view(r, H, D)  # (r, H, D)
        mixed = torch.einsum("hrq,rhd->hqrd", self.pattern_back[:, positions, :keys], u)  # (H, keys, r, D)
        mixed = mixed.reshape(K, a.group, keys, r, D).sum(dim=1)  # (K, keys, r, D)
        return self.add_keys(g, mixed, image)

    def add_keys(self, g: torch.Tensor, mixed: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """g += s[q] dv[q] w_back at keys 1 .. P; returns s[0] dv[0] w_back . image (mixed [K, keys, r, D], float32
        or the products' dtype)."""
        r, P, E = g.shape
        K, _, _, D = mixed.shape
        low = mixed.dtype != g.dtype
        scale = self.scale_low if low else self.norm.scale
        dv = self.scratch.take("dv", (r, P, K, D), mixed.dtype, g.device)
        torch.mul(mixed[:, 1:].permute(2, 1, 0, 3), scale[1:P + 1].view(1, P, 1, 1), out=dv)  # (r, P, K, D)
        if low:  # the product in its dtype, added to the float32 stream
            back = self.scratch.take("back", (r * P, E), mixed.dtype, g.device)
            g.view(r * P, E).add_(rows_product(dv.view(r * P, K * D), self.w_back_low, back))
        else:
            g.view(r * P, E).addmm_(dv.view(r * P, K * D), self.w_back)
        first = mixed[:, 0].permute(1, 0, 2).reshape(r, K * D).float() * self.norm.scale[0]  # (r, K*D)
        return first @ (self.w_back @ image)
