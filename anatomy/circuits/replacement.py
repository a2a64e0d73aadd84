"""The local replacement model of one prompt: the model made linear in its residual stream.

Shape letters: T positions, E d_model, H query heads, K key/value heads, D d_head, F transcoder features,
R rows (targets) whose gradients travel together, P the positions a row can reach (its own and earlier).

Ameisen et al. 2025 ("Circuit Tracing", section 2.2) replace each MLP by a transcoder and freeze, at
the values the prompt gives them, everything that is not linear in the residual stream:

    attention patterns        A_h[p, q]                    (softmax(q k^T) of this prompt)
    normalisation scales      s[q] = 1 / sqrt(mean(x^2) + eps)   (RMSNorm; LayerNorm: 1 / std, centring kept)
    each MLP's output         = its transcoder's features' decoder vectors + an error term + b_dec
                                (+ a skip path x W_skip, linear, kept)

so that the residual stream at every point is a sum of the vectors the nodes write (token embeddings,
features a_f d_f, errors e), carried linearly forward, plus what no node carries (biases, positional
embeddings, the first position). With frozen patterns and scales one attention sublayer is the
linear map

    attn(x)[p] = sum_h sum_q A_h[p, q] (norm(x)[q] W_V^h) W_O^h,      norm(x)[q] = x[q] s[q] g

and the replacement reproduces the model's logits exactly (its errors make up the difference).

This module captures the frozen quantities from one traced pass and gives the maps:

    forward       the affine replacement, for what no node carries (`constants`)
    transpose     attention^T, norm^T, skip^T: a target's reading vector carried back toward the
                  embeddings, one gradient per row, as a backward pass would, without autograd
"""

from __future__ import annotations

import torch
from torch import nn

from ..trace import trace

INPUT_POINTS = ("mlp_norm.out", "resid_mid")  # where a transcoder may read, inside blocks.L
OUTPUT_POINTS = ("mlp.out",)  # where it writes


def release(transcoders, layer: int) -> None:
    """Let a set read from its files a layer at a time (anatomy.sae's lazy sets) let go of a layer it has built:
    its pages return; the next use maps it again. Nothing for a set held in memory."""
    if getattr(transcoders, "lazy", False):
        transcoders.release(layer)


def unsupported(model: nn.Module) -> str | None:
    """Why the replacement model cannot be built for `model` (its config flag), or None when it can."""
    config = getattr(model, "config", None)
    if config is None or config.arch != "decoder" or not hasattr(model, "lm_head"):
        return "attribution graphs need a decoder-only language model (arch='decoder' with an LM head)"
    reasons = {
        "norm_position": (config.norm_position != "pre", f"norm_position={config.norm_position!r} (only 'pre')"),
        "parallel_residual": (config.parallel_residual, "parallel_residual=True"),
        "n_experts": (config.n_experts > 0, f"n_experts={config.n_experts} (a mixture of experts)"),
        "lm_head_transform": (config.lm_head_transform, "lm_head_transform=True"),
        "embed_norm": (config.embed_norm, "embed_norm=True"),
        "d_embed": (config.d_embed != config.d_model, f"d_embed={config.d_embed} != d_model={config.d_model}"),
        "final_logit_softcap": (config.final_logit_softcap is not None,
                                f"final_logit_softcap={config.final_logit_softcap} (logits are not linear)"),
        "lm_head_rescale": (config.lm_head_rescale, "lm_head_rescale=True"),
    }
    for _, (bad, words) in reasons.items():
        if bad:
            return f"attribution graphs need a pre-norm, sequential decoder; this model has {words}"
    return None


def norm_parts(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, bool, float]:
    """(gain [E], bias [E] or None, centred?, eps) of a LayerNorm or RMSNorm."""
    if hasattr(norm, "bias"):  # LayerNorm: (x - mean) / sqrt(var + eps) * gamma + beta
        return norm.weight.detach().float(), norm.bias.detach().float(), True, norm.eps
    gain = norm.weight.detach().float()
    return (1.0 + gain if getattr(norm, "plus_one", False) else gain), None, False, norm.eps


def norm_scale(x: torch.Tensor, centred: bool, eps: float) -> torch.Tensor:
    """[T, E] -> [T]: the frozen 1 / sqrt(mean(x^2) + eps), or 1 / sqrt(var(x) + eps) for a LayerNorm."""
    x = x.float()
    if centred:
        return torch.rsqrt(x.var(dim=-1, unbiased=False) + eps)
    return torch.rsqrt(x.pow(2).mean(dim=-1) + eps)


class FrozenNorm:
    """A norm with its scale frozen: x -> (x - centre(x)) s[q] g (+ beta); linear but for beta."""

    def __init__(self, norm: nn.Module, x: torch.Tensor):
        self.gain, self.bias, self.centred, eps = norm_parts(norm)
        self.scale = norm_scale(x, self.centred, eps)  # (T,)

    def forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] (positions 0 ..) -> [T, E]; constant=False leaves beta out (the linear part alone)."""
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        y = x * (self.scale[: x.size(0), None] * self.gain)
        return y + self.bias if constant and self.bias is not None else y

    def transpose_at(self, g: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """[k, E] reading vectors at one position (or each at its own, position [k]) -> their gradients there,
        g s[q] gain, centred for a LayerNorm (the centring is its own transpose)."""
        scale = self.scale[position]
        g = g * ((scale[:, None] if scale.dim() else scale) * self.gain)
        return g - g.mean(dim=-1, keepdim=True) if self.centred else g


class FrozenAttention:
    """One attention sublayer with its patterns frozen: attn(x)[p] = sum_h sum_q A_h[p, q] (x[q] W_V^h) W_O^h.

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
    """One attention sublayer of the replacement, norm and attention together: x -> attn(norm(x)), with the
    patterns and the norm's scale frozen, and its transpose for rows of gradients.

    Carried back, a row's gradient g at query positions p goes to key positions q as

        u = g W_o                                  per head                     [r, P, H, D]
        dv[q] = s[q] sum_h sum_p A_h[p, q] u_h[p]   its heads' share of each key/value group
        dx[q] = dv[q] (W_v gain C)                 gain: the norm's gain, C its centring (a LayerNorm)

    with the gain and the centring folded into W_v once (w_back), so that the norm costs a scale on the
    narrow side (K D) only, and dx is added to g in place (the residual: x + attn(norm(x)))."""

    def __init__(self, norm: nn.Module, attention: nn.Module, pattern: torch.Tensor, x: torch.Tensor):
        self.norm = FrozenNorm(norm, x)
        self.attention = FrozenAttention(attention, pattern)
        w_back = self.attention.w_v * self.norm.gain  # (K*D, E)
        self.w_back = w_back - w_back.mean(dim=1, keepdim=True) if self.norm.centred else w_back

    def forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] (positions 0 ..) -> [T, E]: attn(norm(x)); constant=False leaves every bias out."""
        return self.attention.forward(self.norm.forward(x, constant), constant)

    def add_transpose(self, g: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """g [r, P, E] (contiguous) rows' gradients at query positions 1 .. P: add what this sublayer carries
        back to positions 1 .. P in place, and return [r] what it carries to position 0, dotted with
        `image` [E] (the first token's image there)."""
        a = self.attention
        r, P, E = g.shape
        H, K, D, keys = a.n_heads, a.n_kv, a.d_head, P + 1
        u = (g.view(r * P, E) @ a.w_o).view(r, P, H, D).permute(2, 1, 0, 3).reshape(K, a.group * P, r * D)
        # sum over a group's heads and its queries at once: one contraction over (head, query) per group
        mixed = torch.bmm(self.mixing(P), u).view(K, keys, r, D)  # (K, keys, r, D)
        return self.add_keys(g, mixed, image)

    def mixing(self, P: int) -> torch.Tensor:
        """[K, keys, group P]: A_h[p, q] for key q, laid out so that one product sums a group's heads and
        queries 1 .. P (made for each call, not kept: a long prompt has many P, each P^2 H floats)."""
        a = self.attention
        pattern = a.pattern[:, 1:P + 1, :P + 1].transpose(1, 2)  # (H, keys, P)
        return pattern.reshape(a.n_kv, a.group, P + 1, P).permute(0, 2, 1, 3).reshape(a.n_kv, P + 1, a.group * P)

    def add_transpose_at(self, g: torch.Tensor, image: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """add_transpose for rows whose gradient is still at their own position alone (they joined at this
        layer): P for every row, or positions [r] (1 .. P) one each; W_o is applied there only."""
        a = self.attention
        r, P, E = g.shape
        H, K, D, keys = a.n_heads, a.n_kv, a.d_head, P + 1
        if positions is None:
            positions = torch.full((r,), P, device=g.device)
        u = (g[torch.arange(r, device=g.device), positions - 1] @ a.w_o).view(r, H, D)  # (r, H, D)
        mixed = torch.einsum("hrq,rhd->hqrd", a.pattern[:, positions, :keys], u)  # (H, keys, r, D)
        mixed = mixed.reshape(K, a.group, keys, r, D).sum(dim=1)  # (K, keys, r, D)
        return self.add_keys(g, mixed, image)

    def add_keys(self, g: torch.Tensor, mixed: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """g += s[q] dv[q] w_back at keys 1 .. P; returns s[0] dv[0] w_back . image (mixed [K, keys, r, D])."""
        r, P, E = g.shape
        K, _, _, D = mixed.shape
        scale = self.norm.scale
        dv = torch.empty(r, P, K, D, device=g.device)
        torch.mul(mixed[:, 1:].permute(2, 1, 0, 3), scale[1:P + 1].view(1, P, 1, 1), out=dv)  # (r, P, K, D)
        g.view(r * P, E).addmm_(dv.view(r * P, K * D), self.w_back)
        first = mixed[:, 0].permute(1, 0, 2).reshape(r, K * D) * scale[0]  # (r, K*D)
        return first @ (self.w_back @ image)


class Replacement:
    """The frozen quantities of one prompt's pass through `model` with `transcoders`, and the linear maps.

    ids [T] (the prompt, BOS included). After construction:
        embed [T, E]            each token's embedding vector (what a token node writes)
        inputs[l] [T, E]        what layer l's transcoder reads (its input point)
        outputs[l] [T, E]       the MLP's output at layer l (its output point)
        sublayers[l]: FrozenSublayer (attention, its norm); mlp_norms[l], final_norm: FrozenNorm
        logits [V]              the model's logits at the last position
    """

    def __init__(self, model: nn.Module, transcoders, ids: torch.Tensor):
        self.model, self.transcoders = model, transcoders
        self.n_layers = model.config.n_layers
        self.ids = ids.to(next(model.parameters()).device)
        self.input_points = [transcoders.input_point(layer) for layer in range(self.n_layers)]
        names = ["embed", "blocks.*.resid_pre", "blocks.*.resid_mid", "blocks.*.attn.pattern", "blocks.*.mlp.out",
                 "blocks.*.mlp_norm.out", f"blocks.{self.n_layers - 1}.resid_post", "logits"]
        if model.config.pos_encoding in ("learned", "sinusoidal"):
            names.append("pos_embed")
        with torch.no_grad(), trace(model, names) as t:
            model(self.ids[None])
        self.trace = t
        blocks = model.blocks
        self.embed = t["embed"][0].float()  # (T, E)
        self.sublayers = [FrozenSublayer(blocks[l].attn_norm, blocks[l].attn, t[f"blocks.{l}.attn.pattern"][0],
                                         t[f"blocks.{l}.resid_pre"][0]) for l in range(self.n_layers)]
        self.mlp_norms = [FrozenNorm(blocks[l].mlp_norm, t[f"blocks.{l}.resid_mid"][0]) for l in range(self.n_layers)]
        last = t[f"blocks.{self.n_layers - 1}.resid_post"][0]
        self.final_norm = FrozenNorm(model.final_norm, last)
        self.inputs = [t[point][0].float() for point in self.input_points]  # (T, E) each
        self.outputs = [t[f"blocks.{l}.mlp.out"][0].float() for l in range(self.n_layers)]
        self.logits = t["logits"][0, -1].float()  # (V,)
        self.unembed = model.lm_head.proj.weight.detach()  # (V, E), as the model holds it (logit_vectors reads it)
        self.device = self.embed.device
        self.skips = []  # a float32 copy of each (the set's own may be a file's pages, let go after each layer)
        for l in range(self.n_layers):
            skip = transcoders.skip(l)
            self.skips.append(None if skip is None else skip.detach().to(self.device, torch.float32, copy=True))
            release(transcoders, l)
        # a skip's transpose with the MLP norm's gain and centring folded in, as the sublayers fold theirs
        self.skips_back = [None if skip is None else self.folded_input_transpose(l, skip.T) for l, skip in enumerate(self.skips)]
        bias = model.lm_head.proj.bias
        self.unembed_bias = None if bias is None else bias.detach().float()

    def logit_vectors(self, ids: torch.Tensor, block: int = 16384) -> torch.Tensor:
        """[k, E]: u_id - mean_v u_v for each id, in float32 (a logit demeaned over the vocabulary, as
        circuit-tracer reads it); the mean a block of rows at a time, so that no float copy of a large
        unembedding (256k x 2304) is made."""
        V = self.unembed.size(0)
        mean = sum(self.unembed[start:start + block].float().sum(dim=0) for start in range(0, V, block)) / V  # (E,)
        return self.unembed[ids.to(self.device)].float() - mean

    # ---- the transcoder's input point, as a map from the residual stream (resid_mid) ---------------
    def reads_normed(self, layer: int) -> bool:
        """Whether layer's transcoder reads the MLP's normed input (else resid_mid itself)."""
        return self.input_points[layer].endswith("mlp_norm.out")

    def input_transpose_at(self, layer: int, g: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """[k, E] reading vectors at the transcoder's input, at one position (or position [k]) -> gradients at resid_mid."""
        return self.mlp_norms[layer].transpose_at(g, position) if self.reads_normed(layer) else g

    def input_forward(self, layer: int, resid_mid: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] resid_mid -> what layer's transcoder reads, through the frozen norm if it reads the norm's output."""
        return self.mlp_norms[layer].forward(resid_mid, constant) if self.reads_normed(layer) else resid_mid

    def folded_input_transpose(self, layer: int, w: torch.Tensor) -> torch.Tensor:
        """w [., E] (a map onto the transcoder's input) with the MLP norm's gain and centring folded in."""
        if not self.reads_normed(layer):
            return w
        norm = self.mlp_norms[layer]
        w = w * norm.gain
        return w - w.mean(dim=-1, keepdim=True) if norm.centred else w

    def add_skip_transpose(self, layer: int, g: torch.Tensor) -> None:
        """g [r, P, E] gradients at the MLP's output, positions 1 .. P: add in place their part at resid_mid through
        a skip transcoder's x_in skip(l), s[q] (g S^T gain C) (nothing without one)."""
        back = self.skips_back[layer]
        if back is None:
            return
        r, P, E = g.shape
        through = (g.view(r * P, E) @ back).view(r, P, E)
        if self.reads_normed(layer):
            through *= self.mlp_norms[layer].scale[1:P + 1].view(1, P, 1)
        g += through

    def first_position_images(self) -> list[torch.Tensor]:
        """[E] per layer: what the first token's embedding has become at resid_pre(l), at the first position,
        through the replacement's linear paths (it attends to itself alone; a skip passes it on)."""
        z = self.embed[0][None]  # (1, E)
        images = []
        for layer in range(self.n_layers):
            images.append(z[0])
            z = z + self.sublayers[layer].forward(z, constant=False)
            if self.skips[layer] is not None:
                z = z + self.input_forward(layer, z, constant=False) @ self.skips[layer]
        return images
