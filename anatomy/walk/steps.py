"""The walkthrough: one real forward pass, narrated step by step in the seeds' order.

Shape letters: T query positions, S key positions (S = T in self-attention), E d_model,
D d_head, F d_ff, V vocabulary, H heads.

The model runs once under `anatomy.trace(model)`. Every matrix a step shows is read from that
trace (or computed from traced tensors, where the model has no name for it, e.g. QK^T before
scaling). Every step then recomputes its result from its inputs in float64, with the module's own
weights, and compares with the model's tensor: `Check` says "matches" or flags the mismatch.

    walk = walkthrough(model, ids, tokens=tokens, layer=0, head=0)
    walk.ok                      # every check passed
    walk.steps[9].matrices[0]    # the attention pattern of head 0, as the model computed it
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..layers import LayerNorm, RMSNorm
from ..masks import causal_mask
from ..trace import Trace, trace

# How the recomputation may differ from the model: float32 against float64 round-off.
RELATIVE_TOLERANCE = 1e-5
# Up to this many vocabulary entries, one-hot columns and embedding rows are all shown; above it,
# only those of the tokens in the sentence (the rest of a one-hot row is zeros anyway).
FULL_VOCAB = 16


# What a step shows ------------------------------------------------------------------------------

@dataclass
class Matrix:
    """One matrix (or vector) a step shows, in full: renderers cut large ones to corners.

    `point` and `index` say where it was read: `trace[point][index]` equals `values`. Matrices
    computed by the walkthrough from traced tensors (QK^T, the mask) have `point` None.
    kind: "values" (numbers), "mask" (True = may attend), "int" (ids, one-hot).
    """

    name: str
    latex: str
    values: torch.Tensor  # [rows, cols] or [n], float64 (bool for a mask)
    rows: list[str] | None = None
    cols: list[str] | None = None
    point: str | None = None
    index: tuple = ()
    kind: str = "values"
    note: str | None = None  # where it comes from, when not a trace point (a parameter, the input)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def shape_text(self) -> str:
        return "×".join(str(n) for n in self.shape)

    @property
    def source(self) -> str:
        """Where the numbers come from, e.g. `blocks.0.attn.q[0, 0]`, or 'computed'."""
        if self.point is None:
            return self.note or "computed from traced tensors"
        index = ", ".join(":" if isinstance(i, slice) else str(i) for i in self.index)
        return f"{self.point}[{index}]" if index else self.point


@dataclass
class Check:
    """A step's recomputation compared with the model's own tensor."""

    recomputed: str  # what the walkthrough computed, in words
    against: str  # the model's tensor it was compared with
    max_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tolerance

    @property
    def summary(self) -> str:
        if self.ok:
            return f"✓ recomputed as {self.recomputed}: matches {self.against} (max |diff| = {self.max_diff:.1e})"
        return (f"✗ MISMATCH: recomputed as {self.recomputed}, differs from {self.against} "
                f"(max |diff| = {self.max_diff:.3g} > tolerance {self.tolerance:.1e})")


@dataclass
class Step:
    """One step of the pass: what it computes (equation), with which numbers, and its check."""

    section: str  # e.g. "Input", "Layer 0", "Decoder layer 0", "Output"
    title: str
    text: str  # the narration, plain text
    equation: str  # plain Unicode, for the terminal and html
    latex: str  # the same, for markdown
    matrices: list[Matrix] = field(default_factory=list)
    check: Check | None = None
    number: int = 0


@dataclass
class Walkthrough:
    """The narrated pass: `steps` in order, the `trace` they were read from, and the settings."""

    steps: list[Step]
    trace: Trace
    config: object
    layer: int
    head: int
    tokens: list[str]
    target_tokens: list[str] | None = None
    model_name: str = "model"

    @property
    def ok(self) -> bool:
        """Whether every step's recomputation matched the model."""
        return all(step.check is None or step.check.ok for step in self.steps)

    @property
    def failures(self) -> list[Step]:
        return [step for step in self.steps if step.check is not None and not step.check.ok]

    @property
    def titles(self) -> list[str]:
        return [step.title for step in self.steps]

    def to_markdown(self) -> str:
        from .render import render_markdown

        return render_markdown(self)

    def to_html(self) -> str:
        from .render import render_html

        return render_html(self)

    def to_text(self, width: int = 110) -> str:
        """The terminal rendering without colour."""
        from .render import render_text

        return render_text(self, width=width)

    def print(self, console=None) -> None:
        from .render import render_terminal

        render_terminal(self, console=console)


# Recomputation helpers (float64) ---------------------------------------------------------------

def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float64)


def _linear(x: torch.Tensor, linear: nn.Linear, rows: slice | None = None) -> torch.Tensor:
    """x W^T + b with the module's weights (rows of W: one head's slice of the output)."""
    weight = _f64(linear.weight)
    bias = _f64(linear.bias) if linear.bias is not None else None
    if rows is not None:
        weight = weight[rows]
        bias = bias[rows] if bias is not None else None
    y = x @ weight.T
    return y + bias if bias is not None else y


def _norm(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """LayerNorm or RMSNorm over the last axis, from the definition and the module's weights."""
    if isinstance(module, LayerNorm):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance, as LayerNorm uses
        return (x - mean) / torch.sqrt(var + module.eps) * _f64(module.weight) + _f64(module.bias)
    if isinstance(module, RMSNorm):
        return x / torch.sqrt((x ** 2).mean(dim=-1, keepdim=True) + module.eps) * _f64(module.weight)
    raise TypeError(f"unknown norm module {type(module).__name__}")


def _softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise exp(s - max) / sum; blocked entries (allowed False) get weight 0."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.max(dim=-1, keepdim=True).values.clamp(min=-1e300)
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp(min=1e-300), torch.zeros_like(e))


# activation name -> (the function in float64, its equation)
_ACTS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "relu": (lambda x: x.clamp(min=0.0), "max(0, x)"),
    "gelu": (lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), "x·Φ(x)"),
    "gelu_tanh": (lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
                  "½x(1 + tanh(√(2/π)(x + 0.044715x³)))"),
    "silu": (lambda x: x * torch.sigmoid(x), "x·σ(x)"),
    "swiglu": (lambda x: x * torch.sigmoid(x), "x·σ(x)"),
    "geglu": (lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), "x·Φ(x)"),
}
_ACT_NAMES = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU", "silu": "SiLU", "swiglu": "SiLU", "geglu": "GELU"}


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def _vec(values: torch.Tensor, keep: int = 3, limit: int = 8) -> str:
    """A vector as text, cut to its ends when long: [0.1, 0.2, …, 0.9]."""
    items = [float(v) for v in values]
    if len(items) > limit:
        return "[" + ", ".join(map(_fmt, items[:keep])) + ", …, " + ", ".join(map(_fmt, items[-keep:])) + "]"
    return "[" + ", ".join(map(_fmt, items)) + "]"


def _rows(values: torch.Tensor) -> torch.Tensor:
    return values if values.dim() == 2 else values[None, :]


# The builder -----------------------------------------------------------------------------------

class _Builder:
    """Reads the trace, recomputes, and appends steps; one per walkthrough."""

    def __init__(self, model: nn.Module, t: Trace, label: Callable[[int], str], head: int):
        self.model = model
        self.config = model.config
        self.t = t
        self.label = label
        self.head = head
        self.steps: list[Step] = []
        self.param_names = {id(param): name for name, param in model.named_parameters()}

    def param(self, name: str, latex: str, param: torch.Tensor, rows: slice | list[int] | None = None,
              transpose: bool = True, labels=None, note: str = "") -> Matrix:
        """A weight as the equations use it: W (in × out), i.e. the module's weight transposed."""
        values = _f64(param)
        where = self.param_names.get(id(param), "parameter")
        if isinstance(rows, slice):
            values = values[rows]
            where += f"[{rows.start}:{rows.stop}]"
        elif rows is not None:
            values = values[rows]
            where += note
        if transpose and values.dim() == 2:
            values, where = values.T, where + "ᵀ"
        if values.dim() == 1:
            values = values[None, :]
        return Matrix(name, latex, values, rows=labels, note="parameter " + where)

    # reading and checking
    def get(self, point: str, *index) -> torch.Tensor:
        return _f64(self.t[point][index] if index else self.t[point])

    def matrix(self, name: str, latex: str, point: str, index: tuple, rows=None, cols=None) -> Matrix:
        return Matrix(name, latex, self.get(point, *index), rows=rows, cols=cols, point=point, index=index)

    def check(self, recomputed: str, against: str, mine: torch.Tensor, theirs: torch.Tensor) -> Check:
        if mine.shape != theirs.shape:
            return Check(f"{recomputed} (shape {tuple(mine.shape)})", f"{against} (shape {tuple(theirs.shape)})",
                         float("inf"), 0.0)
        diff = float((mine - theirs).abs().max()) if mine.numel() else 0.0
        scale = float(theirs.abs().max()) if theirs.numel() else 0.0
        return Check(recomputed, against, diff, RELATIVE_TOLERANCE * max(1.0, scale))

    def add(self, section: str, title: str, text: str, equation: str, latex: str,
            matrices: list[Matrix] | None = None, check: Check | None = None) -> Step:
        step = Step(section, title, text, equation, latex, matrices or [], check, len(self.steps) + 1)
        self.steps.append(step)
        return step

    # the input -------------------------------------------------------------------------------
    def input_steps(self, stack: nn.Module, p: str, ids: list[int], tokens: list[str], section: str,
                    one_hot: bool = True) -> None:
        config = self.config
        T, V, E = len(ids), config.vocab_size, config.d_model
        ids_t = torch.tensor(ids)
        vocab = [self.label(i) for i in range(V)]
        self.add(
            section, "Tokens and ids",
            f"The text is split into {T} tokens and each is replaced by its index in a vocabulary of "
            f"{V} entries. The model sees only these integers.",
            "ids = [stoi[token] for token in tokens]",
            r"\text{ids} = (" + ", ".join(map(str, ids)) + ")",
            [Matrix("ids", r"\text{ids}", ids_t[None, :].to(torch.float64), rows=["id"], cols=list(tokens), kind="int",
                    note="the input")],
        )
        scale = stack.embed_scale
        table = _f64(stack.token_embedding.weight)  # (V, E)
        embed = self.get(f"{p}embed", 0)  # (T, E)
        lookup = table[ids_t] * scale
        scale_text = f" × √d_model (= {scale:.4f}, the paper §3.4)" if scale != 1.0 else ""
        scale_latex = r" \sqrt{d_{model}}" if scale != 1.0 else ""
        shown_ids = list(range(V)) if V <= FULL_VOCAB else sorted(set(ids))
        shown_labels = vocab if V <= FULL_VOCAB else [f"{vocab[i]} ({i})" for i in shown_ids]
        subset = "" if V <= FULL_VOCAB else f"; only the {len(shown_ids)} of {V} entries this sentence uses"
        if one_hot:
            onehot = torch.zeros(T, V, dtype=torch.float64)
            onehot[torch.arange(T), ids_t] = 1.0
            self.add(
                section, "One-hot vectors",
                f"Each id becomes a row of {V} zeros with a single 1 at the token's index: the rows are "
                "orthogonal, and they carry no notion of similarity yet.",
                "O[t, v] = 1 if v = ids[t] else 0,   O ∈ {0,1}^(T×V)",
                r"O_{t,v} = [v = \text{ids}_t], \quad O \in \{0,1\}^{" + f"{T} \\times {V}" + "}",
                [Matrix("O", "O", onehot[:, shown_ids], rows=list(tokens), cols=shown_labels, kind="int",
                        note="built from the ids" + subset + (" (every other column is 0)" if subset else ""))],
                self.check("O · W_E" + (" · √d_model" if scale != 1.0 else ""), f"the model's {p}embed",
                           onehot @ table * scale, embed),
            )
        self.add(
            section, "Embedding lookup",
            f"Multiplying a one-hot row by the embedding matrix W_E ({V}×{E}) selects one of its rows: "
            "the embedding layer is a lookup table, one learned vector per token.",
            "E = O · W_E" + scale_text,
            r"E = O\, W_E" + scale_latex,
            [self.param("W_E", "W_E", stack.token_embedding.weight, transpose=False, labels=shown_labels,
                        rows=None if V <= FULL_VOCAB else shown_ids, note=subset),
             Matrix("E", "E", embed, rows=list(tokens), point=f"{p}embed", index=(0,))],
            self.check("rows ids of W_E" + (" × √d_model" if scale != 1.0 else ""), f"the model's {p}embed",
                       lookup, embed),
        )
        self.position_step(stack, p, tokens, section)
        parts, total = ["E", "P"] if hasattr(stack, "position_embedding") else ["E"], embed
        if hasattr(stack, "position_embedding"):
            total = total + self.get(f"{p}pos_embed", 0)
        if hasattr(stack, "token_type_embedding"):
            types = self.get(f"{p}type_embed", 0)
            type_table = _f64(stack.token_type_embedding.weight)
            self.add(
                section, "Token-type embeddings",
                "BERT adds a third vector saying which segment (sentence A or B) a token belongs to; "
                "a single sentence is all segment 0.",
                "T_type = W_type[0]  for every position",
                r"T = W_{type}[0]",
                [Matrix("T_type", "T", types, rows=list(tokens), point=f"{p}type_embed", index=(0,))],
                self.check("row 0 of W_type", f"the model's {p}type_embed", type_table[[0] * T], types),
            )
            parts.append("T")
            total = total + types
        x0 = f"{p}blocks.0.resid_pre"
        x = self.get(x0, 0)
        equation = "X = " + " + ".join(parts)
        latex = "X = " + " + ".join(parts)
        text = "The input of the first layer is the sum: meaning (E) plus position (P)."
        if not hasattr(stack, "position_embedding"):
            text = ("The input of the first layer is E itself: this model puts its position information "
                    "inside attention instead (see the positional-encoding step).")
        recomputed = total
        if hasattr(stack, "embed_norm"):
            equation = f"X = LayerNorm({' + '.join(parts)})"
            latex = r"X = \mathrm{LayerNorm}(" + " + ".join(parts) + ")"
            text += " BERT then normalises each row (a LayerNorm right after the embeddings)."
            recomputed = _norm(total, stack.embed_norm)
        focus = min(4, T - 1)
        if hasattr(stack, "position_embedding") and not hasattr(stack, "embed_norm"):
            text += (f" For '{tokens[focus]}' at position {focus}: {_vec(embed[focus])} + "
                     f"{_vec(total[focus] - embed[focus])} = {_vec(x[focus])}.")
        self.add(
            section, "Input to the first layer: " + equation, text, equation, latex,
            [Matrix("X", "X", x, rows=list(tokens), point=x0, index=(0,))],
            self.check(equation.split("= ", 1)[1], f"the model's {x0} (the input of layer 0)", recomputed, x),
        )

    def position_step(self, stack: nn.Module, p: str, tokens: list[str], section: str) -> None:
        config = self.config
        T, E = len(tokens), config.d_model
        rows = [f"{t}: {tok}" for t, tok in enumerate(tokens)]
        kind = config.pos_encoding
        title = "Positional encoding"
        if kind == "sinusoidal":
            pe = self.get(f"{p}pos_embed", 0)
            position = torch.arange(T, dtype=torch.float64)[:, None]
            pair = torch.arange(E // 2, dtype=torch.float64)[None, :]
            angle = position / 10000.0 ** (2 * pair / E)  # (T, E/2)
            mine = torch.empty(T, E, dtype=torch.float64)
            if config.sinusoid_layout == "interleaved":
                mine[:, 0::2], mine[:, 1::2] = torch.sin(angle), torch.cos(angle)
                layout = "dimensions 2i and 2i+1 hold the sine and cosine of one frequency"
            else:
                mine[:, : E // 2], mine[:, E // 2:] = torch.sin(angle), torch.cos(angle)
                layout = "all the sines come first, then all the cosines (the Marian layout)"
            self.add(
                section, title,
                "Attention by itself is blind to order, so a fixed vector of sinusoids, one per position, "
                f"is added to each embedding (the paper §3.5): {layout}, i = 0 … {E // 2 - 1}. "
                "The frequency is indexed by the pair i, as in the paper; seeds 001 and 004 write the "
                "exponent with the dimension index, which makes the frequencies fall twice as fast, "
                "so their p_3 differs from the row shown here.",
                f"PE(pos, 2i) = sin(pos / 10000^(2i/{E})),   PE(pos, 2i+1) = cos(pos / 10000^(2i/{E}))",
                r"PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/" + str(E) + r"}}\right), \quad "
                r"PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/" + str(E) + r"}}\right)",
                [Matrix("P", "P", pe, rows=rows, point=f"{p}pos_embed", index=(0,))],
                self.check("the formula, in float64", f"the model's {p}pos_embed", mine, pe),
            )
        elif kind == "learned":
            pe = self.get(f"{p}pos_embed", 0)
            table = _f64(stack.position_embedding.weight)
            self.add(
                section, title,
                "This model learned one vector per position (BERT, GPT-2): rows 0 … T−1 of a trained "
                f"table of {config.max_seq_len} positions are added to the embeddings.",
                "P = W_P[0 … T−1]",
                r"P = W_P[0 \ldots T-1]",
                [Matrix("P", "P", pe, rows=rows, point=f"{p}pos_embed", index=(0,))],
                self.check("rows 0 … T−1 of W_P", f"the model's {p}pos_embed", table[:T], pe),
            )
        elif kind == "rotary":
            self.add(
                section, title,
                "This model adds no position vector to the embeddings: it uses rotary positions (RoPE, "
                "Llama). Inside every attention layer each pair of query and key dimensions is rotated "
                "by an angle proportional to the position, so that q_m · k_n depends on m − n only. "
                "See the rotation step in the layer below.",
                "no P: X = E;  q_m ← R(m θ) q_m,  k_n ← R(n θ) k_n",
                r"X = E, \quad q_m \leftarrow R_{m\theta}\, q_m, \quad k_n \leftarrow R_{n\theta}\, k_n",
            )
        elif kind == "alibi":
            self.add(
                section, title,
                "This model adds no position vector: it uses ALiBi. Each head adds −m_h·|i − j| to the "
                "score of query i and key j, a penalty growing with distance (see the scaling step).",
                "no P: X = E;  S[i, j] += −m_h |i − j|",
                r"X = E, \quad S_{ij} \mathrel{+}= -m_h\,|i-j|",
            )
        else:
            self.add(
                section, title,
                "This model uses no position information at all (pos_encoding='none'): it cannot tell "
                "'dog bites man' from 'man bites dog' except through a causal mask.",
                "no P: X = E", r"X = E",
            )

    # one layer -------------------------------------------------------------------------------
    def layer_steps(self, stack: nn.Module, p: str, layer: int, tokens: list[str], section: str, *,
                    memory: tuple[str, list[str]] | None = None, compact_self: bool = False) -> None:
        """The block's steps in the order its norm_position computes them."""
        block = stack.blocks[layer]
        b = f"{p}blocks.{layer}."
        pre = block.norm_position != "post"
        causal = stack.causal
        self_mask = causal_mask(len(tokens)) if causal else torch.ones(len(tokens), len(tokens), dtype=torch.bool)
        norm_name = "LayerNorm" if self.config.norm == "layernorm" else "RMSNorm"

        stream = f"{b}resid_pre"  # the residual stream entering each sublayer
        sublayers = [("attn", "attn_norm", "resid_mid", False)]
        if block.has_cross_attention:
            sublayers.append(("cross_attn", "cross_attn_norm", "resid_cross", True))
        sublayers.append(("mlp", "mlp_norm", "resid_post", False))
        for name, norm, out_point, cross in sublayers:
            sub_in = stream
            if pre:
                sub_in = f"{b}{norm}.out"
                self.add(
                    section, f"{norm_name} before the " + ("feed-forward network" if name == "mlp" else
                                                           "cross-attention" if cross else "attention"),
                    f"Pre-norm (GPT-2, Llama): each sublayer reads a normalised copy of the residual stream, "
                    "which itself is never normalised inside the block.",
                    f"X̂ = {norm_name}(X)", r"\hat X = \mathrm{" + norm_name + "}(X)",
                    [self.matrix("X̂", r"\hat X", sub_in, (0,), rows=tokens)],
                    self.check(f"{norm_name}(X) with the module's γ, β and ε", f"the model's {sub_in}",
                               _norm(self.get(stream, 0), getattr(block, norm)), self.get(sub_in, 0)),
                )
            if name == "mlp":
                self.ffn_step(block, b, sub_in, tokens, section)
                sub_out, what = f"{b}mlp.out", "FFN"
            else:
                attn = getattr(block, name)
                if cross:
                    kv_point, kv_tokens = memory
                    self.attention_steps(attn, f"{b}{name}.", sub_in, kv_point, tokens, kv_tokens,
                                         None, None, section, cross=True)
                elif compact_self:
                    self.compact_attention_step(attn, f"{b}{name}.", sub_in, tokens, self_mask, section)
                else:
                    bias = self.alibi(stack, len(tokens)) if self.config.pos_encoding == "alibi" else None
                    self.attention_steps(attn, f"{b}{name}.", sub_in, sub_in, tokens, tokens,
                                         self_mask, bias, section, cross=False)
                sub_out, what = f"{b}{name}.out", ("CrossAttention" if cross else "Attention")
            result = f"{b}{out_point}"
            x, y = self.get(stream, 0), self.get(sub_out, 0)
            if pre:
                self.add(
                    section, "Residual connection",
                    "The sublayer's output is added to the stream it read from: the residual path lets "
                    "every layer refine the representation instead of replacing it.",
                    f"X' = X + {what}({norm_name}(X))",
                    f"X' = X + \\mathrm{{{what}}}(\\mathrm{{{norm_name}}}(X))",
                    [self.matrix("X'", "X'", result, (0,), rows=tokens)],
                    self.check(f"X + {what}", f"the model's {result}", x + y, self.get(result, 0)),
                )
            else:
                gamma, beta = getattr(block, norm).weight, getattr(block, norm).bias
                shown = [Matrix(f"X + {what}", f"X + \\mathrm{{{what}}}", x + y, rows=tokens),
                         self.matrix("X'", "X'", result, (0,), rows=tokens)]
                if self.config.d_model <= 16:
                    shown.append(self.param("γ", r"\gamma", gamma, labels=["γ"]))
                    if beta is not None:
                        shown.append(self.param("β", r"\beta", beta, labels=["β"]))
                mean_var = ("LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β"
                            if norm_name == "LayerNorm" else "RMSNorm(x) = x / √(mean(x²) + ε) · γ")
                self.add(
                    section, f"Residual and {norm_name}",
                    "Post-norm (the paper, BERT, seed 003): add the sublayer's output to its input, then "
                    f"normalise each row to mean 0 and variance 1 and rescale it: {mean_var}, "
                    f"ε = {getattr(block, norm).eps:g}.",
                    f"X' = {norm_name}(X + {what}(X))",
                    f"X' = \\mathrm{{{norm_name}}}(X + \\mathrm{{{what}}}(X))",
                    shown,
                    self.check(f"{norm_name}(X + {what}) from the module's γ, β, ε", f"the model's {result}",
                               _norm(x + y, getattr(block, norm)), self.get(result, 0)),
                )
            stream = result

    def alibi(self, stack: nn.Module, n: int) -> torch.Tensor:
        slopes = _f64(stack.alibi_slopes)  # (H,)
        position = torch.arange(n, dtype=torch.float64)
        return -slopes[:, None, None] * (position[:, None] - position[None, :]).abs()  # (H, T, T)

    def head_slices(self, attn: nn.Module) -> tuple[int, int, slice, slice]:
        h, D = self.head, attn.d_head
        g = h // (attn.n_heads // attn.n_kv_heads)  # the key/value head serving query head h
        return h, g, slice(h * D, (h + 1) * D), slice(g * D, (g + 1) * D)

    def attention_steps(self, attn, a: str, q_in: str, kv_in: str, q_tokens, kv_tokens, allowed, bias,
                        section: str, *, cross: bool) -> None:
        """Q, K, V; QK^T; scaling; mask; softmax; A·V; concatenation and W_O: for head `self.head`."""
        h, g, q_rows, kv_rows = self.head_slices(attn)
        D, T, S = attn.d_head, len(q_tokens), len(kv_tokens)
        xq, xkv = self.get(q_in, 0), self.get(kv_in, 0)
        small = self.config.d_model <= 16
        what = "cross-attention" if cross else "attention"
        src = "M" if cross else "X"
        kv_note = f" (key/value head {g}, shared by a group of query heads)" if attn.n_kv_heads != attn.n_heads else ""
        q, k, v = self.get(f"{a}q", 0, h), self.get(f"{a}k", 0, g), self.get(f"{a}v", 0, g)
        weights = [self.param(f"W_{n}", f"W_{n}", getattr(attn, f"{n}_proj").weight, rows)
                   for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]
        shown = (weights if small else []) + [
            Matrix("Q", "Q", q, rows=q_tokens, point=f"{a}q", index=(0, h)),
            Matrix("K", "K", k, rows=kv_tokens, point=f"{a}k", index=(0, g)),
            Matrix("V", "V", v, rows=kv_tokens, point=f"{a}v", index=(0, g)),
        ]
        mine = torch.cat([_linear(xq, attn.q_proj, q_rows), _linear(xkv, attn.k_proj, kv_rows),
                          _linear(xkv, attn.v_proj, kv_rows)], dim=0)
        has_bias = attn.q_proj.bias is not None
        b = lambda n: f" + b_{n}" if has_bias else ""  # noqa: E731
        if cross:
            text = ("Cross-attention: the queries come from the decoder (what each target position is "
                    "looking for), the keys and values from the encoder output M (what each source "
                    f"token offers). Head {h} of {attn.n_heads} uses its own {D}-column slice of each matrix.")
        else:
            text = (f"Three learned projections map each row of the input into a query (what am I looking "
                    f"for?), a key (what do I contain?) and a value (what do I pass on?). Head {h} of "
                    f"{attn.n_heads} uses its own {D}-column slice of each matrix (d_k = d_model / h = {D}).")
        in_name = "X̂" if q_in.endswith("norm.out") else "X"
        self.add(
            section, f"Queries, keys and values (head {h})" if not cross else f"Cross-attention: Q from the decoder, K and V from the encoder (head {h})",
            text + kv_note,
            f"Q = {in_name}·W_q{b('q')},   K = {src}·W_k{b('k')},   V = {src}·W_v{b('v')}",
            f"Q = {in_name.replace('X̂', chr(92) + 'hat X')} W_q{b('q')}, \\quad K = {src} W_k{b('k')}, \\quad V = {src} W_v{b('v')}",
            shown,
            self.check("the projections with the module's W and b", f"the model's {a}q, {a}k, {a}v",
                       mine, torch.cat([q, k, v], dim=0)),
        )
        if attn.rotary is not None and not cross:
            q_rot, k_rot = self.get(f"{a}q_rot", 0, h), self.get(f"{a}k_rot", 0, g)
            theta = self.config.rope_theta
            inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
            angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
            angle = torch.cat([angle, angle], dim=-1)  # (T, D)

            def rotate(x):
                first, second = x.chunk(2, dim=-1)
                return x * angle.cos() + torch.cat([-second, first], dim=-1) * angle.sin()

            self.add(
                section, f"Rotary positions: rotate Q and K (head {h})",
                "Each pair of dimensions (j, j + D/2) of a query or key at position m is rotated by the "
                f"angle m·θ^(−2j/D), θ = {theta:g}. Values are not rotated.",
                "q̃_m = q_m ⊙ cos(mω) + rotate_half(q_m) ⊙ sin(mω),  ω_j = θ^(−2j/D)",
                r"\tilde q_m = q_m \odot \cos(m\omega) + \mathrm{rot}(q_m) \odot \sin(m\omega)",
                [Matrix("Q̃", r"\tilde Q", q_rot, rows=q_tokens, point=f"{a}q_rot", index=(0, h)),
                 Matrix("K̃", r"\tilde K", k_rot, rows=kv_tokens, point=f"{a}k_rot", index=(0, g))],
                self.check("the rotation, in float64", f"the model's {a}q_rot, {a}k_rot",
                           torch.cat([rotate(q), rotate(k)]), torch.cat([q_rot, k_rot])),
            )
            q, k = q_rot, k_rot
        scores = self.get(f"{a}scores", 0, h)  # scaled, bias added, not yet masked
        head_bias = bias[h] if bias is not None else torch.zeros(T, S, dtype=torch.float64)
        raw = q @ k.T  # (T, S)
        focus = min(4, T - 1)
        focus_k = min(focus, S - 1)
        shape_word = f"rectangular, {T}×{S}: one row per target position, one column per source token" if cross \
            else f"{T}×{S}: one row per query, one column per key"
        self.add(
            section, "Dot products QKᵀ",
            f"Every query is compared with every key by a dot product: large when they point the same "
            f"way. The result is {shape_word}. For example "
            f"q('{q_tokens[focus]}') · k('{kv_tokens[focus_k]}') = {_fmt(float(raw[focus, focus_k]))}.",
            "QKᵀ[i, j] = q_i · k_j = Σ_d Q[i, d] K[j, d]",
            r"(QK^\top)_{ij} = q_i \cdot k_j = \sum_d Q_{id} K_{jd}",
            [Matrix("QKᵀ", r"QK^\top", raw, rows=q_tokens, cols=kv_tokens)],
            self.check("Q·Kᵀ from the traced Q and K", f"√d_k × the model's {a}scores"
                       + (" − ALiBi bias" if bias is not None else ""),
                       raw, (scores - head_bias) * math.sqrt(D)),
        )
        scale_text = (f"Dividing by √d_k = √{D} = {math.sqrt(D):.4f} keeps the scores' variance near 1 whatever "
                      "the head width, so the softmax does not saturate into a one-hot row.")
        equation, latex = "S = QKᵀ / √d_k", r"S = \frac{QK^\top}{\sqrt{d_k}}"
        shown = [Matrix("S", "S", scores, rows=q_tokens, cols=kv_tokens, point=f"{a}scores", index=(0, h))]
        if bias is not None:
            slope = f" (m_{h} = {float(-head_bias[1, 0]):.4f})" if T > 1 else ""
            scale_text += f" ALiBi then adds a bias −m_h·|i − j|: distant keys are penalised{slope}."
            equation, latex = "S = QKᵀ / √d_k + B,   B[i, j] = −m_h |i − j|", \
                r"S = \frac{QK^\top}{\sqrt{d_k}} + B, \quad B_{ij} = -m_h |i-j|"
            shown.insert(0, Matrix("B", "B", head_bias, rows=q_tokens, cols=kv_tokens))
        self.add(
            section, "Scaling by √d_k", scale_text, equation, latex, shown,
            self.check("QKᵀ / √d_k" + (" + B" if bias is not None else ""), f"the model's {a}scores",
                       raw / math.sqrt(D) + head_bias, scores),
        )
        pattern = self.get(f"{a}pattern", 0, h)
        if allowed is None:
            allowed = torch.ones(T, S, dtype=torch.bool)
        masked = scores.masked_fill(~allowed, float("-inf"))
        if bool(allowed.all()):
            text = ("No mask: " + ("every target position may attend to every source token (there is no "
                                   "padding in a single sentence)." if cross else
                                   "every token may attend to every token, before and after it "
                                   "(bidirectional attention, an encoder)."))
            equation, latex = "M = 0 everywhere: S_masked = S", r"M = 0, \quad S_{masked} = S"
            title = "The mask (none: bidirectional)" if not cross else "The mask (none: every source token is visible)"
        else:
            text = ("The causal mask: token i may attend only to tokens j ≤ i, never to the future it must "
                    "predict. Blocked scores become −∞, so that exp(−∞) = 0 after the softmax. (The model "
                    "writes the most negative float32, −3.4e38, rather than −∞: it cannot overflow, and "
                    "exp sends both to 0.)")
            equation = "S_masked = S + M,   M[i, j] = 0 if j ≤ i else −∞"
            latex = r"S_{masked} = S + M, \quad M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}"
            title = "The causal mask"
        self.add(
            section, title, text, equation, latex,
            [Matrix("may attend", r"\text{may attend}", allowed, rows=q_tokens, cols=kv_tokens, kind="mask"),
             Matrix("S_masked", r"S_{masked}", masked, rows=q_tokens, cols=kv_tokens)],
            self.check("zero attention wherever the mask blocks", f"the model's {a}pattern",
                       torch.zeros(int((~allowed).sum()), dtype=torch.float64), pattern[~allowed]),
        )
        mine = _softmax(scores, allowed)
        row = pattern[focus]
        self.add(
            section, "Row-wise softmax",
            "Each row is turned into a probability distribution over the keys: exponentiate, then divide "
            f"by the row's sum. Row '{q_tokens[focus]}': softmax({_vec(masked[focus])}) = {_vec(row)}, "
            f"which sums to {float(row.sum()):.4f}.",
            "A[i, j] = exp(S[i, j]) / Σ_k exp(S[i, k])",
            r"A_{ij} = \frac{\exp(S_{ij})}{\sum_k \exp(S_{ik})}",
            [Matrix("A", "A", pattern, rows=q_tokens, cols=kv_tokens, point=f"{a}pattern", index=(0, h))],
            self.check("softmax of the masked scores", f"the model's {a}pattern", mine, pattern),
        )
        z = self.get(f"{a}z", 0, slice(None), h)  # (T, D)
        self.add(
            section, "Weighted sum of values: A·V",
            "Each output row is a mixture of the value rows, weighted by that row of A: the token's "
            "new, contextualised representation (in this head's subspace).",
            f"head_{h} = A·V", f"\\mathrm{{head}}_{h} = A V",
            [Matrix(f"head_{h}", f"\\mathrm{{head}}_{h}", z, rows=q_tokens, point=f"{a}z", index=(0, slice(None), h))],
            self.check("A·V from the traced A and V", f"the model's {a}z (head {h})", pattern @ v, z),
        )
        self.output_projection_step(attn, a, q_tokens, section)

    def output_projection_step(self, attn, a: str, tokens, section: str) -> None:
        H, D = attn.n_heads, attn.d_head
        z_all = self.get(f"{a}z", 0)  # (T, H, D)
        concat = z_all.reshape(len(tokens), H * D)
        out = self.get(f"{a}out", 0)
        b = " + b_O" if attn.o_proj.bias is not None else ""
        shown = [Matrix("Concat(heads)", r"\mathrm{Concat}(\mathrm{head}_0, \ldots)", concat, rows=tokens,
                        cols=[f"h{i // D}·{i % D}" for i in range(H * D)])]
        if self.config.d_model <= 16:
            shown.append(self.param("W_O", "W_O", attn.o_proj.weight))
        shown.append(Matrix("MultiHead", r"\mathrm{MultiHead}", out, rows=tokens, point=f"{a}out", index=(0,)))
        self.add(
            section, "Concatenate the heads and project: W_O",
            f"All {H} heads ran the same steps in parallel, each on its own slice. Their outputs are "
            f"placed side by side ({H}×{D} = {H * D} columns) and mixed by one more learned matrix W_O.",
            f"MultiHead = Concat(head_0, …, head_{H - 1})·W_O{b}",
            r"\mathrm{MultiHead} = \mathrm{Concat}(\mathrm{head}_0, \ldots, \mathrm{head}_{" + str(H - 1)
            + r"})\, W_O" + b.replace("b_O", "b_O"),
            shown,
            self.check("Concat(heads)·W_O" + b, f"the model's {a}out", _linear(concat, attn.o_proj), out),
        )

    def compact_attention_step(self, attn, a: str, x_in: str, tokens, allowed, section: str) -> None:
        """The decoder's masked self-attention in one step, recomputed end to end for every head."""
        x = self.get(x_in, 0)
        T, H, D = len(tokens), attn.n_heads, attn.d_head
        group = H // attn.n_kv_heads
        heads = []
        for h in range(H):
            g = h // group
            q = _linear(x, attn.q_proj, slice(h * D, (h + 1) * D))
            k = _linear(x, attn.k_proj, slice(g * D, (g + 1) * D))
            v = _linear(x, attn.v_proj, slice(g * D, (g + 1) * D))
            heads.append(_softmax(q @ k.T / math.sqrt(D), allowed) @ v)
        mine = _linear(torch.cat(heads, dim=-1), attn.o_proj)
        h = self.head
        self.add(
            section, "Masked self-attention over the target",
            "The decoder first attends to its own tokens, exactly as in the steps above but with the "
            "causal mask: each target position sees only the positions before it. Shown: the pattern of "
            f"head {h} and the output of all heads after W_O.",
            "MultiHead(X) = Concat(softmax(Q_h K_hᵀ / √d_k + M) V_h)·W_O",
            r"\mathrm{MultiHead}(X) = \mathrm{Concat}_h\!\left(\mathrm{softmax}\!\left(\frac{Q_h K_h^\top}"
            r"{\sqrt{d_k}} + M\right) V_h\right) W_O",
            [self.matrix("A", "A", f"{a}pattern", (0, h), rows=tokens, cols=tokens),
             self.matrix("MultiHead", r"\mathrm{MultiHead}", f"{a}out", (0,), rows=tokens)],
            self.check("every head recomputed from X with the module's weights", f"the model's {a}out",
                       mine, self.get(f"{a}out", 0)),
        )

    def ffn_step(self, block, b: str, x_in: str, tokens, section: str) -> None:
        mlp = block.mlp
        activation = self.config.activation
        act, act_eq = _ACTS[activation]
        act_name = _ACT_NAMES[activation]
        x = self.get(x_in, 0)
        if mlp.gated:
            hidden_mine = act(_linear(x, mlp.fc_gate)) * _linear(x, mlp.fc_in)
            equation = f"FFN(x) = ({act_name}(x·W_gate) ⊙ x·W_in)·W_out"
            latex = r"\mathrm{FFN}(x) = \left(\mathrm{" + act_name + r"}(x W_{gate}) \odot x W_{in}\right) W_{out}"
        else:
            hidden_mine = act(_linear(x, mlp.fc_in))
            equation = f"FFN(x) = {act_name}(x·W_1 + b_1)·W_2 + b_2,   {act_name}(x) = {act_eq}"
            latex = r"\mathrm{FFN}(x) = \mathrm{" + act_name + r"}(x W_1 + b_1)\, W_2 + b_2"
            if activation == "relu":
                equation = "FFN(x) = max(0, x·W_1 + b_1)·W_2 + b_2"
                latex = r"\mathrm{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2"
        out_mine = _linear(hidden_mine, mlp.fc_out)
        hidden, out = self.get(f"{b}mlp.post", 0), self.get(f"{b}mlp.out", 0)
        F, E = self.config.d_ff, self.config.d_model
        shown = [self.param("W_1", "W_1", mlp.fc_in.weight)] if E <= 16 else []
        shown.append(self.matrix(f"{act_name}(x·W_1 + b_1)", r"\mathrm{" + act_name + r"}(x W_1 + b_1)",
                                 f"{b}mlp.post", (0,), rows=tokens))
        if E <= 16:
            shown.append(self.param("W_2", "W_2", mlp.fc_out.weight))
        shown.append(self.matrix("FFN", r"\mathrm{FFN}", f"{b}mlp.out", (0,), rows=tokens))
        both = torch.cat([hidden_mine.flatten(), out_mine.flatten()])
        self.add(
            section, "Feed-forward network",
            f"The same two-layer network is applied to every position on its own: widen from d_model = "
            f"{E} to d_ff = {F}, apply the non-linearity {act_name}, and project back to {E}. Attention "
            "mixed information between tokens; this step processes each token's mixture.",
            equation, latex, shown,
            self.check("both layers with the module's weights", f"the model's {b}mlp.post and {b}mlp.out",
                       both, torch.cat([hidden.flatten(), out.flatten()])),
        )

    # the end ---------------------------------------------------------------------------------
    def rest_steps(self, stack: nn.Module, p: str, layer: int, tokens, section: str) -> str:
        """Remaining layers (a continuity check) and the final norm; returns the stack's output point."""
        n = self.config.n_layers
        last = f"{p}blocks.{n - 1}.resid_post"
        if layer < n - 1:
            gaps = [self.get(f"{p}blocks.{i}.resid_pre", 0) - self.get(f"{p}blocks.{i - 1}.resid_post", 0)
                    for i in range(layer + 1, n)]
            later = f"{layer + 1}" if layer + 1 == n - 1 else f"{layer + 1} to {n - 1}"
            self.add(
                section, f"The remaining layers ({later})",
                f"Each further layer repeats the same steps with its own weights, reading the previous "
                f"layer's output. After layer {n - 1}:",
                f"X_(l+1) = Block_l(X_l),  l = {layer + 1} … {n - 1}",
                r"X_{l+1} = \mathrm{Block}_l(X_l), \quad l = " + f"{layer + 1} \\ldots {n - 1}",
                [self.matrix(f"X_{n}", f"X_{{{n}}}", last, (0,), rows=tokens)],
                Check("each layer's input", "the previous layer's traced output",
                      float(torch.stack([g.abs().max() for g in gaps]).max()), 0.0),
            )
        if hasattr(stack, "final_norm"):
            out = f"{p}final_norm.out"
            norm_name = "LayerNorm" if self.config.norm == "layernorm" else "RMSNorm"
            self.add(
                section, f"Final {norm_name}",
                "A pre-norm stack leaves its residual stream un-normalised, so one last norm follows "
                "the final layer.",
                f"H = {norm_name}(X_{n})", f"H = \\mathrm{{{norm_name}}}(X_{{{n}}})",
                [self.matrix("H", "H", out, (0,), rows=tokens)],
                self.check(f"{norm_name} with the module's weights", f"the model's {out}",
                           _norm(self.get(last, 0), stack.final_norm), self.get(out, 0)),
            )
            return out
        return last

    def lm_steps(self, lm_head, hidden_point: str, tokens, section: str, top_k: int = 5) -> None:
        hidden = self.get(hidden_point, 0)
        logits = self.get("logits", 0)  # (T, V)
        V = logits.shape[-1]
        x = hidden
        if hasattr(lm_head, "transform_dense"):
            act = _ACTS[self.config.activation][0]
            x = _norm(act(_linear(x, lm_head.transform_dense)), lm_head.transform_norm)
        mine = _linear(x, lm_head.proj)
        tied = self.config.tie_embeddings
        vocab = [self.label(i) for i in range(V)]
        bias = " + b" if lm_head.proj.bias is not None else ""
        self.add(
            section, "Output projection: logits",
            "Each position's final vector is scored against every token of the vocabulary"
            + (": the output layer reuses the embedding matrix, transposed (tied weights, the paper §3.4)."
               if tied else "."),
            ("logits = H·W_Eᵀ" if tied else "logits = H·W_out") + bias,
            (r"\text{logits} = H\, W_E^\top" if tied else r"\text{logits} = H\, W_{out}") + bias,
            [Matrix("logits", r"\text{logits}", logits, rows=tokens, cols=vocab, point="logits", index=(0,))],
            self.check("H·W" + ("_Eᵀ" if tied else "_out") + bias, "the model's logits", mine, logits),
        )
        probs = _softmax(logits)
        last = probs[-1]
        k = min(top_k, V)
        top = torch.topk(last, k)
        shown = [Matrix("p", "p", probs, rows=[f"after '{t}'" for t in tokens], cols=vocab)]
        shown.append(Matrix(f"top {k} after '{tokens[-1]}'", r"\text{top-" + str(k) + "}",
                            top.values[:, None], rows=[f"{self.label(int(i))} (id {int(i)})" for i in top.indices],
                            cols=["p"]))
        self.add(
            section, "Next-token probabilities",
            "A softmax over the vocabulary turns each row of logits into the model's distribution for the "
            f"next token; row t predicts token t + 1. After '{tokens[-1]}' the most likely next token is "
            f"'{self.label(int(top.indices[0]))}' (p = {float(top.values[0]):.4f})."
            + (" The weights are untrained, so these probabilities illustrate the computation, not language."
               if V <= 64 else ""),
            "p(next | prefix) = softmax(logits)", r"p(\cdot \mid \text{prefix}) = \mathrm{softmax}(\text{logits})",
            shown,
            self.check("softmax of the recomputed logits", "torch.softmax of the model's logits",
                       _softmax(mine), torch.softmax(self.t["logits"][0].double(), dim=-1)),
        )

    def pooled_step(self, hidden_point: str, tokens, section: str) -> None:
        model, config = self.model, self.config
        hidden = self.get(hidden_point, 0)
        if hasattr(model, "pooled"):
            x = hidden[0] if config.pooling == "first" else hidden.mean(dim=0)
            how = "the first token's vector ([CLS])" if config.pooling == "first" else "the mean over positions"
            equation = "pooled = " + ("tanh(W·h_0 + b)" if hasattr(model, "pooler") else
                                      ("h_0" if config.pooling == "first" else "mean_t h_t"))
            latex = r"\text{pooled} = " + (r"\tanh(W h_0 + b)" if hasattr(model, "pooler") else
                                           ("h_0" if config.pooling == "first" else r"\frac{1}{T}\sum_t h_t"))
            if hasattr(model, "pooler"):
                x = torch.tanh(_linear(x, model.pooler.dense))
                how += ", through the pooler's dense layer and tanh (BERT)"
            pooled = self.get("pooled", 0)
            matrix = Matrix("pooled", r"\text{pooled}", pooled[None, :], rows=["pooled"], point="pooled", index=(0,))
            check = self.check("the pooling with the module's weights", "the model's pooled", x, pooled)
            text = f"One vector for the whole sentence: {how}."
        else:
            mean = hidden.mean(dim=0)
            matrix = Matrix("mean-pooled", r"\bar h", mean[None, :], rows=["mean"])
            from ..models import pool

            check = self.check("the mean of the traced rows", "anatomy.models.pool(hidden, mean)",
                               mean, _f64(pool(self.t[hidden_point], None, "mean")[0]))
            equation, latex = "h̄ = (1/T) Σ_t h_t", r"\bar h = \frac{1}{T} \sum_t h_t"
            text = ("One vector for the whole sentence: this model has no pooler, so the rows are averaged "
                    "(mean pooling, as sentence-transformers do for MiniLM). Two sentences are then compared "
                    "by the cosine of their vectors.")
        self.add(section, "Pooled sentence vector", text, equation, latex, [matrix], check)
        settings = (getattr(config, "extra", None) or {}).get("sentence_transformers")
        if settings:
            self.sentence_embedding_step(hidden_point, settings, section)

    def sentence_embedding_step(self, hidden_point: str, settings: dict, section: str) -> None:
        """The vector sentence-transformers uses (MiniLM): pooled hidden states, then unit length."""
        from ..models import pool

        how = settings.get("pooling", "mean")
        hidden = self.get(hidden_point, 0)
        if how == "max":
            mine = hidden.max(dim=0).values
        else:
            mine = hidden[0] if how in ("cls", "first") else hidden.mean(dim=0)
        traced = self.t[hidden_point]
        if how == "max":
            theirs = traced.max(dim=1).values
        else:
            theirs = pool(traced, None, "first" if how in ("cls", "first") else "mean")
        equation = {"mean": "e = (1/T) Σ_t h_t", "max": "e = max_t h_t"}.get(how, "e = h_0")
        latex = {"mean": r"e = \frac{1}{T}\sum_t h_t", "max": r"e = \max_t h_t"}.get(how, "e = h_0")
        if settings.get("normalize"):
            mine = mine / mine.norm()
            theirs = torch.nn.functional.normalize(theirs, dim=-1)
            equation += ",   e ← e / ‖e‖"
            latex += r", \quad e \leftarrow e / \lVert e \rVert"
        self.add(
            section, "Sentence embedding (sentence-transformers)",
            f"The checkpoint says how its sentence vectors are made: {how} pooling over the last hidden "
            "states" + (", then scaled to unit length, so that a dot product is a cosine" if settings.get("normalize")
                        else "") + ". This is the vector used for semantic search and similarity.",
            equation, latex,
            [Matrix("e", "e", mine[None, :], rows=["e"], note=f"computed from {hidden_point}[0]")],
            self.check(f"{how} pooling" + (" and normalisation" if settings.get("normalize") else ""),
                       "anatomy's pool() and torch's normalize on the traced hidden states",
                       mine, _f64(theirs[0])),
        )


# The entry point -------------------------------------------------------------------------------

def _as_ids(ids) -> list[int]:
    if torch.is_tensor(ids):
        if ids.dim() == 2:
            if ids.size(0) != 1:
                raise ValueError(f"the walkthrough narrates one sequence; got a batch of {ids.size(0)}")
            ids = ids[0]
        return [int(i) for i in ids]
    return [int(i) for i in ids]


def _labeller(vocab) -> Callable[[int], str]:
    if vocab is None:
        return str
    if callable(vocab):
        return lambda i: str(vocab(i))
    return lambda i: str(vocab[i]) if i < len(vocab) else str(i)


def walkthrough(
    model: nn.Module,
    ids,
    *,
    tokens: Sequence[str] | None = None,
    vocab: Sequence[str] | Callable[[int], str] | None = None,
    layer: int = 0,
    head: int = 0,
    target_ids=None,
    target_tokens: Sequence[str] | None = None,
    model_name: str = "model",
) -> Walkthrough:
    """Run `model` once on `ids` under a full trace and narrate the pass, in the seeds' order.

    ids [T] (or [1, T]): the input; for an encoder-decoder, the source, with `target_ids` [T'] the
    decoder's input. `tokens`: the strings shown for each id (default: `vocab` of each id).
    `vocab`: id -> token string (a sequence or a function), used for the one-hot columns and the
    next-token table. `layer` and `head`: the block and head narrated in full.

    Returns a Walkthrough whose steps show the traced tensors and whose checks compare each
    recomputation with the model. Raises ValueError for a layer or head out of range (naming the
    range), or a missing target for an encoder-decoder.
    """
    config = model.config
    if not 0 <= layer < config.n_layers:
        raise ValueError(f"layer {layer} is out of range: this model has {config.n_layers} layers, "
                         f"choose 0 … {config.n_layers - 1}")
    if not 0 <= head < config.n_heads:
        raise ValueError(f"head {head} is out of range: this model has {config.n_heads} heads, "
                         f"choose 0 … {config.n_heads - 1}")
    label = _labeller(vocab)
    ids = _as_ids(ids)
    tokens = list(tokens) if tokens is not None else [label(i) for i in ids]
    if len(tokens) != len(ids):
        raise ValueError(f"{len(tokens)} tokens were given for {len(ids)} ids")
    seq2seq = config.arch == "encoder-decoder"
    if seq2seq:
        if target_ids is None:
            raise ValueError("an encoder-decoder needs target_ids (the decoder's input) as well as ids (the source)")
        target_ids = _as_ids(target_ids)
        target_tokens = list(target_tokens) if target_tokens is not None else [label(i) for i in target_ids]

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), trace(model) as t:
            if seq2seq:
                output = model(torch.tensor([ids]), torch.tensor([target_ids]))
            else:
                output = model(torch.tensor([ids]))
    finally:
        model.train(was_training)

    builder = _Builder(model, t, label, head)
    if seq2seq:
        enc, dec = model.encoder, model.decoder
        builder.input_steps(enc, "encoder.", ids, tokens, "Encoder input")
        builder.layer_steps(enc, "encoder.", layer, tokens, f"Encoder layer {layer}")
        memory = builder.rest_steps(enc, "encoder.", layer, tokens, "Encoder output")
        builder.add(
            "Encoder output", "The encoder's output M (the memory)",
            "The last encoder layer's output is the memory: every decoder layer's cross-attention reads "
            "its keys and values from it. It is computed once per source sentence.",
            "M = Encoder(X_source)", r"M = \mathrm{Encoder}(X_{source})",
            [builder.matrix("M", "M", memory, (0,), rows=tokens)],
            builder.check(f"the traced {memory}", "the forward pass's encoder_last_hidden_state",
                          builder.get(memory, 0), _f64(output.encoder_last_hidden_state[0])),
        )
        builder.input_steps(dec, "decoder.", target_ids, target_tokens, "Decoder input", one_hot=False)
        builder.layer_steps(dec, "decoder.", layer, target_tokens, f"Decoder layer {layer}",
                            memory=(memory, tokens), compact_self=True)
        hidden = builder.rest_steps(dec, "decoder.", layer, target_tokens, "Output")
        builder.lm_steps(model.lm_head, hidden, target_tokens, "Output")
    else:
        builder.input_steps(model, "", ids, tokens, "Input")
        if layer > 0:
            builder.add(
                "Input", f"The layers before layer {layer} (" + (f"0 … {layer - 1})" if layer > 1 else "0)"),
                f"The layers before layer {layer} run the same steps with their own weights; "
                f"their output is layer {layer}'s input.",
                f"X_{layer} = Block_{layer - 1}(… Block_0(X))", f"X_{{{layer}}} = \\mathrm{{Block}}_{{{layer - 1}}}"
                + r"(\ldots \mathrm{Block}_0(X))",
                [builder.matrix(f"X_{layer}", f"X_{{{layer}}}", f"blocks.{layer}.resid_pre", (0,), rows=tokens)],
                Check(f"layer {layer}'s input", f"layer {layer - 1}'s traced output",
                      float((builder.get(f"blocks.{layer}.resid_pre", 0)
                             - builder.get(f"blocks.{layer - 1}.resid_post", 0)).abs().max()), 0.0),
            )
        builder.layer_steps(model, "", layer, tokens, f"Layer {layer}")
        hidden = builder.rest_steps(model, "", layer, tokens, "Output")
        if config.arch == "decoder" and hasattr(model, "lm_head"):
            builder.lm_steps(model.lm_head, hidden, tokens, "Output")
        elif config.arch == "encoder":
            builder.pooled_step(hidden, tokens, "Output")
    return Walkthrough(builder.steps, t, config, layer, head, tokens, target_tokens, model_name)
