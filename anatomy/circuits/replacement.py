"""The local replacement model of one prompt: the model made linear in its residual stream.

Shape letters: T positions, E d_model, F transcoder features, R rows (targets) whose gradients travel
together, P the positions a row can reach (its own and earlier).

Ameisen et al. 2025 ("Circuit Tracing", section 2.2) replace each MLP by a transcoder and freeze, at
the values the prompt gives them, everything that is not linear in the residual stream:

    attention patterns        A_h[p, q]                    (softmax of this prompt's scores: soft-capped,
                                                            windowed, q/k-normed, whatever made them)
    normalisation scales      s[q] = 1 / sqrt(mean(x^2) + eps)   (every norm: before a sublayer, on its
                                                            output (sandwich, OLMo 2), after the residual sum
                                                            (post-norm), after the embeddings, the final one)
    each MLP's output         = its transcoder's features' decoder vectors + an error term + b_dec
                                (+ a skip path x W_skip, linear, kept); a mixture of experts is one MLP: the
                                router's choice is part of what the transcoder replaces, and its error
                                node carries what the transcoder misses

so that the residual stream at every point is a sum of the vectors the nodes write (token embeddings,
features a_f d_f, errors e), carried linearly forward, plus what no node carries (biases, positional
embeddings, the first position), and the replacement reproduces the model's logits exactly (its errors
make up the difference). frozen.py has the parts (norms, attention); this module puts them together for
each block as its config lays it out (blocks.py):

    sequential   x_mid  = x + out_norm(attn(norm(x)))            x_post = x_mid + out_norm'(MLP(norm'(x_mid)))
    parallel     x_post = x + attn(norm(x)) + MLP(norm'(x))      attention and MLP read the same stream
    post-norm    x_mid  = norm(x + attn(x))                      x_post = norm'(x_mid + MLP(x_mid))

and gives the maps every layer needs, whatever its layout:

    forward       the affine replacement (block_forward), for what no node carries (`unexplained`)
    transpose     a target's reading vector carried back toward the embeddings, one gradient per row, as a
                  backward pass would, without autograd (sweep.py calls them layer by layer)

The logits explained are the LM head's before a final soft-cap (Gemma 2's c tanh(z / c)), as circuit-tracer
explains them: the cap is not linear, and it keeps the order of the logits.
"""

from __future__ import annotations

import torch
from torch import nn

from ..trace import trace
from .frozen import FrozenNorm, FrozenSublayer, Scratch, recording_norm_inputs

# Where a sequential block's norms sit, by config.norm_position (blocks.py), "{}" for the sublayer (attn, mlp):
# (before the sublayer, reading the stream; on the sublayer's output; on the residual sum after it).
# A parallel block has its norms before its sublayers alone (its MLP's is the attention's when shared).
NORM_PLACES = {
    "pre": ("{}_norm", None, None),
    "sandwich": ("{}_norm", "{}_out_norm", None),
    "post_sublayer": (None, "{}_out_norm", None),
    "post": (None, None, "{}_norm"),
}


def release(transcoders, layer: int) -> None:
    """Let a set read from its files a layer at a time (anatomy.sae's lazy sets) let go of a layer it has built:
    its pages return; the next use maps it again. Nothing for a set held in memory."""
    if getattr(transcoders, "lazy", False):
        transcoders.release(layer)


def unsupported(model: nn.Module) -> str | None:
    """Why the replacement model cannot be built for `model`, in words, or None when it can."""
    config = getattr(model, "config", None)
    if config is None or config.arch != "decoder" or not hasattr(model, "lm_head"):
        return "attribution graphs need a decoder-only language model (arch='decoder' with an LM head)"
    if config.lm_head_transform:
        return (f"attribution graphs need logits that are linear in the last hidden state once norm scales are "
                f"frozen; this model's LM head applies a {config.activation} first (lm_head_transform=True)")
    return None


def block_norms(config) -> dict[str, str | None]:
    """The names, inside a block, of its norms by role: attn_before, attn_output, attn_after_sum (likewise mlp_);
    None where the block has none."""
    if config.parallel_residual:
        mlp = "attn_norm" if config.parallel_shared_norm else "mlp_norm"
        return {"attn_before": "attn_norm", "attn_output": None, "attn_after_sum": None,
                "mlp_before": mlp, "mlp_output": None, "mlp_after_sum": None}
    places = NORM_PLACES[config.norm_position]
    return {f"{sublayer}_{role}": None if place is None else place.format(sublayer)
            for sublayer in ("attn", "mlp") for role, place in zip(("before", "output", "after_sum"), places)}


def transcoder_points(config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the points inside blocks.L a transcoder may read, those it may write), for this model's blocks: the stream
    the MLP reads, its norm's output or its normalised stream before the gain; the MLP's output, or the output
    of the norm on it."""
    norms = block_norms(config)
    stream = "resid_pre" if config.parallel_residual else "resid_mid"
    reads = (stream,) if norms["mlp_before"] is None else (f"{norms['mlp_before']}.out", f"{norms['mlp_before']}.normalized", stream)
    writes = ("mlp.out",) if norms["mlp_output"] is None else ("mlp.out", f"{norms['mlp_output']}.out")
    return reads, writes


class Replacement:
    """The frozen quantities of one prompt's pass through `model` with `transcoders`, and the linear maps.

    ids [T] (the prompt, BOS included). After construction:
        embed [T, E]            each token's embedding vector, as it reaches block 0 (what a token node writes)
        embed_rest [T, E]       what else reaches block 0 (positions, token types, a norm's bias)
        inputs[l] [T, E]        what layer l's transcoder reads (its input point)
        outputs[l] [T, E]       what it replaces (its output point: the MLP's output, or its output norm's)
        sublayers[l]            FrozenSublayer: the attention with the norms around it
        mlp_in[l], mlp_out[l]   FrozenNorm or None: from the stream the MLP reads to the transcoder's input;
                                from its output point to what the block adds
        sum_norms[l]            (the norms after the attention's and the MLP's residual sums) for post-norm
        norms                   {norm module: FrozenNorm}: every norm of the residual stream, frozen at this pass
        logits [V]              the model's logits at the last position (what the targets are chosen by)
        explained_logits [V]    the logits the rows explain: the same, before a final soft-cap

    attention_products: the dtype rows cross attention in (FrozenSublayer's `products`), float32 by default.
    """

    def __init__(self, model: nn.Module, transcoders, ids: torch.Tensor, attention_products: torch.dtype = torch.float32):
        config = model.config
        self.model, self.transcoders = model, transcoders
        self.ids = ids = ids.to(next(model.parameters()).device)
        self.n_layers, self.parallel = config.n_layers, config.parallel_residual
        self.input_points = [transcoders.input_point(layer) for layer in range(self.n_layers)]
        self.output_points = [transcoders.output_point(layer) for layer in range(self.n_layers)]
        names = ["embed", "blocks.*.attn.pattern", "logits", *self.input_points, *self.output_points]
        names += [name for name in ("pos_embed", "type_embed", "project_in.out") if hasattr(model, name.split(".")[0])]
        with torch.no_grad(), recording_norm_inputs(model) as norm_inputs, trace(model, names) as t:
            hidden = model(ids[None]).last_hidden_state[0, -1]
            head = model.lm_head
            self.explained_logits = (head.proj(head.transform(hidden)) if head.softcap is not None else t["logits"][0, -1]).float()
        self.trace = t
        self.logits = t["logits"][0, -1].float()  # (V,)
        self.device = self.logits.device
        self.norms = {norm: FrozenNorm(norm, x[0]) for norm, x in norm_inputs.items()}  # every stream norm, frozen
        self.embeddings(model, t)
        self.sublayers, self.mlp_in, self.mlp_out, self.sum_norms = [], [], [], []
        roles = block_norms(config)
        stream = "resid_pre" if self.parallel else "resid_mid"
        scratch = Scratch()  # the transposes' temporaries, shared by the layers
        for layer, block in enumerate(model.blocks):
            frozen = lambda role, block=block: None if roles[role] is None else self.norms[getattr(block, roles[role])]  # noqa: E731
            before = frozen("attn_before") or FrozenNorm.identity(config.d_model, len(ids), self.device)
            self.sublayers.append(FrozenSublayer(before, block.attn, t[f"blocks.{layer}.attn.pattern"][0], frozen("attn_output"),
                                                 products=attention_products, scratch=scratch))
            inside = self.input_points[layer].split(".", 2)[2]
            reads = None if inside == stream else frozen("mlp_before")
            self.mlp_in.append(reads.before_gain() if reads is not None and inside.endswith(".normalized") else reads)
            self.mlp_out.append(frozen("mlp_output") if self.output_points[layer].endswith(".mlp.out") else None)
            self.sum_norms.append((frozen("attn_after_sum"), frozen("mlp_after_sum")))
        self.inputs = [t[point][0].float() for point in self.input_points]  # (T, E) each
        self.outputs = [t[point][0].float() for point in self.output_points]
        self.final_norm = self.norms[model.final_norm] if hasattr(model, "final_norm") else None
        self.project_out = model.project_out.weight.detach().float() if hasattr(model, "project_out") else None  # (E', E)
        self.head_scale = model.lm_head.rescale
        self.unembed = model.lm_head.proj.weight.detach()  # (V, E'), as the model holds it (logit_vectors reads it)
        bias = model.lm_head.proj.bias
        self.unembed_bias = None if bias is None else bias.detach().float()
        self.skips = []  # a float32 copy of each (the set's own may be a file's pages, let go after each layer)
        for l in range(self.n_layers):
            skip = transcoders.skip(l)
            self.skips.append(None if skip is None else skip.detach().to(self.device, torch.float32, copy=True))
            release(transcoders, l)
        # a skip's transpose with the norms around it folded in (their gains and centrings), as the sublayers
        # fold theirs, and the frozen scales it meets at each position
        self.skips_back, self.skip_scales = [], []
        for layer, skip in enumerate(self.skips):
            back = None if skip is None else skip.T  # (E_out, E_in): g_out @ skip^T
            if back is not None and self.mlp_out[layer] is not None:
                back = self.mlp_out[layer].fold_rows(back)
            if back is not None and self.mlp_in[layer] is not None:
                back = self.mlp_in[layer].fold(back)
            self.skips_back.append(back)
            scale = torch.ones(len(ids), device=self.device)
            for norm in (self.mlp_in[layer], self.mlp_out[layer]):
                scale = scale if norm is None else scale * norm.scale
            self.skip_scales.append(scale)

    def embeddings(self, model: nn.Module, t) -> None:
        """embed and embed_rest: the token embeddings (scaled, projected in) and the rest, through a frozen norm
        after the embeddings if the model has one."""
        tokens = (t["project_in.out"] if "project_in.out" in t else t["embed"])[0].float()  # (T, E)
        rest = torch.zeros_like(tokens)
        for name in ("pos_embed", "type_embed"):
            if name in t:
                rest = rest + t[name][0].float()
        if hasattr(model, "embed_norm"):
            norm = self.norms[model.embed_norm]
            tokens, rest = norm.forward(tokens, constant=False), norm.forward(rest)
        self.embed, self.embed_rest = tokens, rest

    def logit_vectors(self, ids: torch.Tensor, block: int = 16384) -> torch.Tensor:
        """[k, E']: u_id - mean_v u_v for each id, in float32 (a logit demeaned over the vocabulary, as
        circuit-tracer reads it); the mean a block of rows at a time, so that no float copy of a large
        unembedding (256k x 2304) is made."""
        V = self.unembed.size(0)
        mean = sum(self.unembed[start:start + block].float().sum(dim=0) for start in range(0, V, block)) / V  # (E',)
        return self.unembed[ids.to(self.device)].float() - mean

    # ---- the transcoder's input and output points, as maps from and to the residual stream ---------
    def input_forward(self, layer: int, stream: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] the stream the MLP reads (resid_mid; resid_pre in a parallel block) -> what layer's transcoder
        reads, through its norm's frozen scale (and gain, unless it reads the stream before the gain)."""
        norm = self.mlp_in[layer]
        return stream if norm is None else norm.forward(stream, constant)

    def input_transpose_at(self, layer: int, g: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """[k, E] reading vectors at the transcoder's input, at one position (or position [k]) -> gradients at the
        stream it reads."""
        norm = self.mlp_in[layer]
        return g if norm is None else norm.transpose_at(g, position)

    def output_forward(self, layer: int, out: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T', E] at the transcoder's output point (positions 0 ..) -> what the block adds to the stream."""
        norm = self.mlp_out[layer]
        return out if norm is None else norm.forward(out, constant)

    def output_images(self, layer: int, vectors: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[n, ..., E] vectors written at layer's output point, each row at its position [n] -> what each adds to the
        stream."""
        norm = self.mlp_out[layer]
        return vectors if norm is None else norm.at(vectors, positions)

    def input_images(self, layer: int, vectors: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[n, E] vectors in the stream the MLP reads, each at its position [n] -> their part of what the transcoder
        reads (the linear part)."""
        norm = self.mlp_in[layer]
        return vectors if norm is None else norm.at(vectors, positions)

    def skip_transpose(self, layer: int, g: torch.Tensor, first: int = 1) -> torch.Tensor | None:
        """g [r, P, E] gradients where the block adds the MLP's output, positions first .. first + P - 1 -> their
        part at the stream the MLP reads through a skip transcoder's x_in skip(l) (None without one)."""
        back = self.skips_back[layer]
        if back is None:
            return None
        r, P, E = g.shape
        return (g.reshape(r * P, E) @ back).view(r, P, E) * self.skip_scales[layer][first:first + P].view(1, P, 1)

    def sum_transpose(self, layer: int, sublayer: str, g: torch.Tensor, first: int = 1) -> None:
        """A post-norm block's norm after `sublayer`'s residual sum (attn or mlp): g [r, P, E] (positions first ..)
        carried back through it in place (nothing in other blocks)."""
        norm = self.sum_norms[layer][sublayer == "mlp"]
        if norm is not None:
            norm.transpose(g, first)

    # ---- whole blocks, forward ------------------------------------------------------------------
    def block_forward(self, layer: int, x: torch.Tensor, mlp, constant: bool = True) -> torch.Tensor:
        """[T', E] resid_pre (positions 0 ..) -> resid_post through the replacement's block l: attention frozen,
        and mlp(read [T', E]) -> [T', E], the MLP's replacement at the transcoder's output point from what the
        transcoder reads. constant=False leaves every bias out (the linear part)."""
        attn_sum, mlp_sum = self.sum_norms[layer]
        attn = self.sublayers[layer].forward(x, constant)
        if self.parallel:
            return x + attn + self.output_forward(layer, mlp(self.input_forward(layer, x, constant)), constant)
        stream = x + attn if attn_sum is None else attn_sum.forward(x + attn, constant)
        total = stream + self.output_forward(layer, mlp(self.input_forward(layer, stream, constant)), constant)
        return total if mlp_sum is None else mlp_sum.forward(total, constant)

    def final_forward(self, x: torch.Tensor, constant: bool = True) -> torch.Tensor:
        """[T, E] resid_post of the last block -> [E'] what the LM head's matrix reads at the last position:
        the frozen final norm, the projection out (d_embed), the head's rescaling."""
        h = (x if self.final_norm is None else self.final_norm.forward(x, constant))[-1]
        if self.project_out is not None:
            h = self.project_out @ h  # (E',)
        return h * self.head_scale

    def logit_transpose(self, vectors: torch.Tensor) -> torch.Tensor:
        """[k, E'] logit reading vectors (rows of W_U, demeaned) -> their gradients at the last block's output,
        at the last position."""
        g = vectors * self.head_scale
        if self.project_out is not None:
            g = g @ self.project_out  # (k, E)
        return g if self.final_norm is None else self.final_norm.transpose_at(g, len(self.ids) - 1)

    def first_position_images(self) -> list[torch.Tensor]:
        """[E] per layer: what the first token's embedding has become at resid_pre(l), at the first position,
        through the replacement's linear paths (it attends to itself alone; a skip passes it on)."""
        z = self.embed[0][None]  # (1, E)
        images = []
        for layer in range(self.n_layers):
            images.append(z[0])
            skip = self.skips[layer]
            z = self.block_forward(layer, z, (lambda read: torch.zeros_like(read)) if skip is None else
                                   (lambda read, skip=skip: read @ skip), constant=False)
        return images
