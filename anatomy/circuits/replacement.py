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
        """[.., T, E] -> [.., T, E]; constant=False leaves beta out (the linear part alone)."""
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        y = x * (self.scale[: x.size(-2), None] * self.gain)
        return y + self.bias if constant and self.bias is not None else y

    def transpose(self, g: torch.Tensor) -> torch.Tensor:
        """[.., P, E] -> [.., P, E]: the gradient through the frozen norm (its linear part is symmetric
        in E but for the centring, which is its own transpose)."""
        g = g * (self.scale[: g.size(-2), None] * self.gain)
        return g - g.mean(dim=-1, keepdim=True) if self.centred else g

    def transpose_at(self, g: torch.Tensor, position: int) -> torch.Tensor:
        """[k, E] reading vectors at one position -> their gradients there."""
        g = g * (self.scale[position] * self.gain)
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
        """[T, E] (normed) -> [T, E]; constant=False leaves the biases out."""
        T = x.size(0)
        v = x @ self.w_v.T  # (T, K*D)
        if constant and self.b_v is not None:
            v = v + self.b_v
        v = v.view(T, self.n_kv, self.d_head).repeat_interleave(self.group, dim=1)  # (T, H, D)
        z = torch.einsum("hpq,qhd->phd", self.pattern[:, :T, :T], v)  # (T, H, D)
        out = z.reshape(T, -1) @ self.w_o.T  # (T, E)
        return out + self.b_o if constant and self.b_o is not None else out

    def transpose(self, g: torch.Tensor) -> torch.Tensor:
        """[R, P, E] -> [R, P, E]: rows' gradients at the sublayer's output carried to its (normed) input.

            u = g W_o                     per head, [R, P, H, D]
            dv[q] = sum_p A_h[p, q] u[p]   mixed back over positions, summed over each key/value group
            dx = dv W_v                    [R, P, E]
        """
        R, P, E = g.shape
        u = (g.reshape(R * P, E) @ self.w_o).view(R, P, self.n_heads, self.d_head)  # (R, P, H, D)
        u = u.permute(2, 1, 0, 3).reshape(self.n_heads, P, R * self.d_head)  # (H, P, R*D)
        mixed = torch.bmm(self.pattern[:, :P, :P].transpose(1, 2), u)  # (H, P_q, R*D): sum_p A[p, q] u[p]
        mixed = mixed.view(self.n_kv, self.group, P, R, self.d_head).sum(dim=1)  # (K, P, R, D)
        dv = mixed.permute(2, 1, 0, 3).reshape(R * P, self.n_kv * self.d_head)  # (R*P, K*D)
        return (dv @ self.w_v).view(R, P, E)


class Replacement:
    """The frozen quantities of one prompt's pass through `model` with `transcoders`, and the linear maps.

    ids [T] (the prompt, BOS included). After construction:
        embed [T, E]            each token's embedding vector (what a token node writes)
        inputs[l] [T, E]        what layer l's transcoder reads (its input point)
        outputs[l] [T, E]       the MLP's output at layer l (its output point)
        attn_norms[l], mlp_norms[l], final_norm: FrozenNorm; attentions[l]: FrozenAttention
        logits [V]              the model's logits at the last position
    """

    def __init__(self, model: nn.Module, transcoders, ids: torch.Tensor):
        self.model, self.transcoders = model, transcoders
        self.n_layers = model.config.n_layers
        self.ids = ids
        self.input_points = [transcoders.input_point(layer) for layer in range(self.n_layers)]
        names = ["embed", "blocks.*.resid_pre", "blocks.*.resid_mid", "blocks.*.attn.pattern", "blocks.*.mlp.out",
                 "blocks.*.mlp_norm.out", f"blocks.{self.n_layers - 1}.resid_post", "logits"]
        if model.config.pos_encoding in ("learned", "sinusoidal"):
            names.append("pos_embed")
        with torch.no_grad(), trace(model, names) as t:
            model(ids[None])
        self.trace = t
        blocks = model.blocks
        self.embed = t["embed"][0].float()  # (T, E)
        self.attn_norms = [FrozenNorm(blocks[l].attn_norm, t[f"blocks.{l}.resid_pre"][0]) for l in range(self.n_layers)]
        self.mlp_norms = [FrozenNorm(blocks[l].mlp_norm, t[f"blocks.{l}.resid_mid"][0]) for l in range(self.n_layers)]
        self.attentions = [FrozenAttention(blocks[l].attn, t[f"blocks.{l}.attn.pattern"][0]) for l in range(self.n_layers)]
        last = t[f"blocks.{self.n_layers - 1}.resid_post"][0]
        self.final_norm = FrozenNorm(model.final_norm, last)
        self.inputs = [t[point][0].float() for point in self.input_points]  # (T, E) each
        self.outputs = [t[f"blocks.{l}.mlp.out"][0].float() for l in range(self.n_layers)]
        self.logits = t["logits"][0, -1].float()  # (V,)
        self.unembed = model.lm_head.proj.weight.detach().float()  # (V, E)
        bias = model.lm_head.proj.bias
        self.unembed_bias = None if bias is None else bias.detach().float()

    # ---- the transcoder's input point, as a map from the residual stream (resid_mid) ---------------
    def reads_normed(self, layer: int) -> bool:
        """Whether layer's transcoder reads the MLP's normed input (else resid_mid itself)."""
        return self.input_points[layer].endswith("mlp_norm.out")

    def input_transpose(self, layer: int, g: torch.Tensor) -> torch.Tensor:
        """[.., P, E] reading vectors at the transcoder's input -> gradients at resid_mid."""
        return self.mlp_norms[layer].transpose(g) if self.reads_normed(layer) else g

    def input_transpose_at(self, layer: int, g: torch.Tensor, position: int) -> torch.Tensor:
        """[k, E] reading vectors at the transcoder's input, at one position -> gradients at resid_mid."""
        return self.mlp_norms[layer].transpose_at(g, position) if self.reads_normed(layer) else g

    def input_forward(self, layer: int, resid_mid: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] resid_mid -> what layer's transcoder reads, through the frozen norm if it reads the norm's output."""
        return self.mlp_norms[layer].forward(resid_mid, constant) if self.reads_normed(layer) else resid_mid

    def skip_transpose(self, layer: int, g: torch.Tensor) -> torch.Tensor | None:
        """[R, P, E] gradients at the MLP's output -> their part at resid_mid through a skip transcoder's
        x_in skip(l) (None without one)."""
        skip = self.transcoders.skip(layer)
        if skip is None:
            return None
        return self.input_transpose(layer, g @ skip.detach().float().T)  # x_in S: d/dx_in = g S^T
