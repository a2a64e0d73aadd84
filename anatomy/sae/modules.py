"""Sparse autoencoders and transcoders: a trace point's vector written as a sparse sum of learned directions.

Shape letters: N any leading axes (batch, pos), E the input width d_in, F the number of features
d_sae, O the output width d_out (E for an SAE).

An SAE (Bricken et al. 2023, "Towards Monosemanticity"; Cunningham et al. 2023, "Sparse Autoencoders
Find Highly Interpretable Features in Language Models") reads the vector x of one trace point and
writes it back as a non-negative combination of F directions, few of them at a time:

    pre = (x - a b_dec) W_enc + b_enc          a = apply_b_dec_to_input (1 or 0)         [N, F]
    f   = sigma(pre)                           the feature activations                   [N, F]
    x^  = f W_dec + b_dec                      the reconstruction                        [N, O]
    e   = x - x^                               the error term: x = x^ + e exactly

sigma, by kind:

    relu       ReLU(pre); sparsity comes from an L1 penalty in training
    topk       the k largest entries of pre, ReLU'd; every other entry 0 (Gao et al. 2024, "Scaling and
               evaluating sparse autoencoders")
    batchtopk  in training, the k B largest entries of the whole batch of B vectors (Bussmann et al. 2024,
               "BatchTopK Sparse Autoencoders"); in use, pre where pre > theta, theta learned in training
    jumprelu   pre where pre > theta_i, else 0 (Rajamanoharan et al. 2024, "Jumping Ahead"; Gemma Scope)

A transcoder (Dunefsky et al. 2024, "Transcoders Find Interpretable LLM Feature Circuits") has the
same parts but reads one point and predicts another: a layer's MLP input (`blocks.L.mlp_norm.out`) to
its output (`blocks.L.mlp.out`). It never subtracts b_dec from its input (b_dec lives in the output).
A skip transcoder (Paulo, Shabalin and Belrose 2025, "Transcoders Beat Sparse Autoencoders for
Interpretability") adds a dense linear path from its input x_in [N, E] beside the features:

    y^  = f W_dec + b_dec + x_in W_skip^T      W_skip [O, E], SAELens's and circuit-tracer's layout

Parameter names and layouts are SAELens's (W_enc [E, F], W_dec [F, O]), so that its files load by
name, without a table of transposes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..trace import TracePoint, anatomy_name
from .choices import KINDS, WITH_K, WITH_THRESHOLD


class SAE(nn.Module):
    """A sparse autoencoder (or, with `point_out`, a transcoder) of `kind` over `d_sae` features.

    d_in: the width it reads; d_out: the width it writes (d_in unless a transcoder says otherwise).
    k: active features per vector (topk) or on average (batchtopk). point: the anatomy trace point it
    reads (TransformerLens names accepted); point_out: the point a transcoder writes (None for an SAE:
    it writes back where it reads); transcoder: whether it predicts another point than it reads
    (default: when point_out is given or d_out differs from d_in). skip: a skip transcoder's W_skip
    [d_out, d_in], initialised to 0 (a transcoder only). apply_b_dec_to_input: subtract
    b_dec before encoding (SAELens's default for SAEs; never for a transcoder). flatten_heads: the
    point is [.., head, d_head] and the SAE reads it flattened (SAELens's hook_z SAEs). metadata: what
    a file said beyond the weights (model name, dataset), written back by `save`. seed: initialise
    the weights (`initialize`); None leaves them uninitialised, for a loader that fills them.

    Trace points, live when the SAE is attached to a pass (`anatomy.trace(model, saes={point: sae})`):
    features [.., feature], recon and error [.., d_model]. Raises ValueError for an unknown kind, a
    missing or impossible k, or sizes that are not positive integers, before allocating anything.
    """

    def __init__(self, d_in: int, d_sae: int, *, kind: str = "topk", k: float | None = None, d_out: int | None = None,
                 point: str | None = None, point_out: str | None = None, transcoder: bool | None = None,
                 apply_b_dec_to_input: bool | None = None, flatten_heads: bool = False, metadata: dict | None = None,
                 skip: bool = False, dtype: torch.dtype = torch.float32, seed: int | None = 0):
        super().__init__()
        for name, value in (("d_in", d_in), ("d_sae", d_sae), ("d_out", d_in if d_out is None else d_out)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(map(repr, KINDS))}")
        if kind in WITH_K:
            limit = d_sae if kind == "topk" else float(d_sae)
            if k is None or isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k <= limit or \
                    (kind == "topk" and not float(k).is_integer()):
                what = "an integer" if kind == "topk" else "a number"
                raise ValueError(f"kind={kind!r} needs k, {what} in [1, d_sae={d_sae}], got {k!r}")
            k = int(k) if kind == "topk" else float(k)
        elif k is not None:
            raise ValueError(f"k is for kinds {', '.join(WITH_K)}; kind={kind!r} takes no k")
        if transcoder is None:
            transcoder = point_out is not None or (d_out is not None and d_out != d_in)
        if not transcoder and d_out is not None and d_out != d_in:
            raise ValueError(f"an SAE writes back the width it reads (d_in={d_in}); d_out={d_out} makes a transcoder")
        if transcoder and apply_b_dec_to_input:
            raise ValueError("a transcoder cannot subtract b_dec from its input: b_dec has the output's width")
        if skip and not transcoder:
            raise ValueError("skip=True is a skip transcoder's linear path from its input to its output; an SAE has none")
        self.kind, self.k, self.d_in, self.d_sae = kind, k, d_in, d_sae
        self.d_out = d_in if d_out is None else d_out
        self.point = anatomy_name(point) if point else None
        self.point_out = anatomy_name(point_out) if point_out else None
        self.is_transcoder = transcoder
        self.apply_b_dec_to_input = (not transcoder) if apply_b_dec_to_input is None else bool(apply_b_dec_to_input)
        self.flatten_heads = flatten_heads
        self.metadata = dict(metadata or {})

        self.W_enc = nn.Parameter(torch.empty(d_in, d_sae, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_dec = nn.Parameter(torch.empty(d_sae, self.d_out, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(self.d_out, dtype=dtype))
        self.W_skip = nn.Parameter(torch.zeros(self.d_out, d_in, dtype=dtype)) if skip else None
        if kind == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        elif kind == "batchtopk":  # learned from the batches' activations, not by gradient
            self.register_buffer("threshold", torch.zeros(d_sae, dtype=dtype))
        if seed is not None:
            self.initialize(seed)

        leading = "batch pos head d_head" if flatten_heads else "batch pos d_model"
        self.features = TracePoint("batch pos feature")
        self.recon = TracePoint(leading)
        self.error = TracePoint(leading)

    @torch.no_grad()
    def initialize(self, seed: int = 0) -> None:
        """Decoder rows: random unit directions; encoder: the decoder's transpose (Gao et al. 2024, section
        2.3: "we initialize the encoder to the transpose of the decoder"); biases and thresholds 0."""
        generator = torch.Generator().manual_seed(seed)
        directions = torch.randn(self.d_sae, self.d_out, generator=generator, dtype=torch.float64)
        directions /= directions.norm(dim=-1, keepdim=True)
        self.W_dec.copy_(directions)
        if self.d_out == self.d_in:
            self.W_enc.copy_(directions.T)
        else:  # a transcoder's encoder reads another width: its own random directions
            self.W_enc.copy_(F.normalize(torch.randn(self.d_sae, self.d_in, generator=generator), dim=-1).T)
        self.b_enc.zero_()
        self.b_dec.zero_()
        if self.W_skip is not None:
            self.W_skip.zero_()
        if self.kind in WITH_THRESHOLD:
            self.threshold.zero_()

    # ---- the three equations ------------------------------------------------------------------
    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, F]: (x - a b_dec) W_enc + b_enc."""
        x = self._flat(x)
        if x.size(-1) != self.d_in:
            raise ValueError(f"this SAE reads vectors of width {self.d_in}; got shape {tuple(x.shape)}")
        x = x.to(self.W_enc.dtype)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N, F]: sigma(pre), by kind (see the module docstring)."""
        if self.kind == "relu":
            return F.relu(pre)
        if self.kind == "topk":
            values, indices = pre.topk(self.k, dim=-1, sorted=False)  # (N, k)
            return torch.zeros_like(pre).scatter_(-1, indices, values.relu())
        if self.kind == "batchtopk" and self.training:
            return batch_topk(pre, self.k)
        # jumprelu, and batchtopk in use: ReLU(pre) where pre > theta (SAELens's formula, to the bit)
        return F.relu(pre) * (pre > self.threshold).to(pre.dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, F]: the feature activations f = sigma(pre)."""
        return self.activate(self.pre_activations(x))

    def decode(self, f: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """[N, F] -> [N, O]: x^ = f W_dec + b_dec (unflattened to [.., head, d_head] for a flatten_heads SAE);
        a skip transcoder adds x W_skip^T, x [N, E] its input (ValueError when x is not given)."""
        if f.size(-1) != self.d_sae:
            raise ValueError(f"this SAE has {self.d_sae} features; got activations of shape {tuple(f.shape)}")
        out = f @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise ValueError("a skip transcoder decodes with its input: decode(f, x), x [.., d_in]")
            out = out + x.to(self.W_skip.dtype) @ self.W_skip.T
        return out.unflatten(-1, self._head_shape) if self.flatten_heads and self._head_shape else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, O]: decode(encode(x), x), the reconstruction (a transcoder's prediction of its output)."""
        return self.decode(self.encode(x), x)

    # ---- attached to a forward pass -----------------------------------------------------------
    def splice(self, x: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
        """The point's value written as the SAE sees it, reconstruction + error, through its trace points.

        x: the point's value [N, O]; source: what the SAE reads, when it is another point (a
        transcoder's MLP input); else x. Returns x^ + e, where e = x - x^ is computed from the clean
        features, so that the result is x itself until an intervention changes the features, the
        reconstruction or the error (zeroing the error splices the SAE in alone). It is computed as

            out = x + (x^' - x^) + (e' - e)           (the primed values after the trace's interventions)

        so that both differences are exactly 0 when nothing changed (e is computed again for the second:
        an intervention may change the error in place). Gradients are the model's: d out / d x = I;
        d out / d features = W_dec; d out / d error = I (features and error are views: their own autograd
        nodes)."""
        reads = x if source is None else source
        f_clean = self.encode(reads)
        recon_clean = self.decode(f_clean, reads)
        if recon_clean.shape != x.shape:
            raise ValueError(f"this SAE writes vectors of shape {tuple(recon_clean.shape[-2 if self.flatten_heads else -1:])}"
                             f" but the point it is attached to holds {tuple(x.shape)}")
        error_clean = x - recon_clean
        error = self.error(error_clean.view_as(error_clean))
        features = self.features(f_clean.view_as(f_clean))  # changed in place, f_clean is no longer needed
        # an unlistened point cannot have changed, and without gradients nothing needs its own node
        if self.features.active or torch.is_grad_enabled():
            recon = self.decode(features, reads)
        else:
            recon = recon_clean.clone() if self.recon.active else recon_clean
        recon = self.recon(recon)
        return (x + (recon - recon_clean) + (error - (x - recon_clean))).to(x.dtype)

    @property
    def _head_shape(self) -> tuple[int, ...] | None:
        return getattr(self, "_heads", None)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        """A flatten_heads SAE reads [.., head, d_head] as [.., head * d_head] (and remembers the split)."""
        if not self.flatten_heads:
            return x
        self._heads = tuple(x.shape[-2:])
        return x.flatten(-2)

    # ---- helpers ------------------------------------------------------------------------------
    def feature_direction(self, feature: int) -> torch.Tensor:
        """[O]: the decoder row of `feature` (what one unit of it adds to the reconstruction)."""
        self.check_feature(feature)
        return self.W_dec[feature]

    def check_feature(self, feature) -> int:
        """`feature` as an int in [0, d_sae); ValueError otherwise."""
        if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < self.d_sae:
            raise ValueError(f"feature must be an integer in [0, d_sae={self.d_sae}), got {feature!r}")
        return feature

    def save(self, folder) -> "Path":  # noqa: F821 - see saelens.py
        """Write SAELens's format (cfg.json + sae_weights.safetensors) to `folder`; SAELens loads it back."""
        from .saelens import save_sae  # the writer reads this SAE's fields and never imports this module

        return save_sae(self, folder)

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        where = f", point={self.point!r}" if self.point else ""
        out = f", point_out={self.point_out!r}" if self.point_out else ""
        skip = ", skip=True" if self.W_skip is not None else ""
        return f"kind={self.kind!r}{k}, d_in={self.d_in}, d_sae={self.d_sae}, d_out={self.d_out}{where}{out}{skip}"


def batch_topk(pre: torch.Tensor, k: float) -> torch.Tensor:
    """[N, F] -> [N, F]: the round(k N) largest entries of ReLU(pre) over the whole batch, every other 0
    (k active features per vector on average, more on a dense vector, fewer on a sparse one)."""
    acts = F.relu(pre)
    flat = acts.flatten()  # (N*F,)
    count = min(flat.numel(), max(1, math.floor(k * acts[..., 0].numel())))
    values, indices = flat.topk(count, sorted=False)
    return torch.zeros_like(flat).scatter_(0, indices, values).view_as(acts)
