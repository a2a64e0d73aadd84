"""The output section: the remaining layers, the final norm, logits and probabilities (or the
pooled sentence vector of an encoder without a language-model head).

Shape letters: T positions, E d_model, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import pool
from .block_steps import norm_step
from .builder import Builder, fmt, vec
from .narration import say
from .reference import activation, f64, linear, norm, softcap, softmax
from .types import Check, Matrix

TOP_K = 5


def rest_steps(b: Builder, stack: nn.Module, p: str, layer: int, tokens, section: str) -> str:
    """The layers after `layer` (a continuity check) and the final norm; returns the output point."""
    n = len(stack.blocks)
    last = f"{p}blocks.{n - 1}.resid_post"
    if layer < n - 1:
        # each difference is 0 exactly when the two tensors are equal, in float32 as in float64: no copy
        gaps = [(b.t[f"{p}blocks.{i}.resid_pre"][0] - b.t[f"{p}blocks.{i - 1}.resid_post"][0]).double()
                for i in range(layer + 1, n)]
        later = f"{layer + 1}" if layer + 1 == n - 1 else f"{layer + 1} to {n - 1}"
        b.add(
            section, f"The remaining layers ({later})", say("later_layers", last=n - 1),
            f"X_(l+1) = Block_l(X_l),  l = {layer + 1} … {n - 1}",
            r"X_{l+1} = \mathrm{Block}_l(X_l), \quad l = " + f"{layer + 1} \\ldots {n - 1}",
            [b.matrix(f"X_{n}", f"X_{{{n}}}", last, (0,), rows=tokens)],
            Check("each layer's input", "the previous layer's traced output",
                  float(torch.stack([g.abs().max() for g in gaps]).max()), 0.0),
        )
    if hasattr(stack, "final_norm"):
        out = f"{p}final_norm.out"
        norm_step(b, section, "Final " + ("LayerNorm" if b.config.norm == "layernorm" else "RMSNorm"),
                  say("final_norm"), stack.final_norm, last, out, tokens, "H")
        last = out
    if hasattr(stack, "project_out"):
        out = f"{p}project_out.out"
        b.add(section, "Projection back to the embedding width",
              f"The last hidden state is narrowed back to the embeddings' width, {stack.project_out.out_features}, "
              "so that the output layer can reuse the embedding matrix (OPT).",
              "H ← H·W_out", r"H \leftarrow H\, W_{out}",
              [b.matrix("H·W_out", r"H W_{out}", out, (0,), rows=tokens)],
              b.check("H·W_out with the module's weight", f"the model's {out}",
                      linear(b.get(last, 0), stack.project_out), b.get(out, 0)))
        last = out
    return last


def lm_steps(b: Builder, lm_head, hidden_point: str, tokens, section: str, *, masked: str | None = None,
             trained: bool = True) -> None:
    """Logits, then the softmax over the vocabulary, the highlighted row worked by hand.

    masked: the mask token of a masked-language model (its rows are guesses for that position,
    not for the next one).
    """
    V = b.t["logits"].shape[-1]
    cap = getattr(b.config, "final_logit_softcap", None)
    kept: dict[str, torch.Tensor] = {}  # what the steps left for later compute once, when first read

    def logits() -> torch.Tensor:  # (T, V): the model's own, in float64
        if "logits" not in kept:
            kept["logits"] = b.get("logits", 0)
        return kept["logits"]

    def mine() -> torch.Tensor:  # the float64 logits: T × V × E multiply-adds
        if "mine" not in kept:
            x = b.get(hidden_point, 0)
            if hasattr(lm_head, "transform_dense"):
                x = norm(activation(b.config.activation)[0](linear(x, lm_head.transform_dense)), lm_head.transform_norm)
            if lm_head.rescale != 1.0:
                x = x * lm_head.rescale  # T5's tied head reads H / √d_model
            kept["mine"] = softcap(linear(x, lm_head.proj), cap)
        return kept["mine"]

    tied = b.config.tie_embeddings
    vocab = b.vocabulary(V)
    bias = " + b" if lm_head.proj.bias is not None else ""
    b.add_later(
        section, "Output projection: logits", say("logits") + (say("tied") if tied else "."),
        ("logits = H·W_Eᵀ" if tied else "logits = H·W_out") + bias + (f",  then {cap:g}·tanh(· / {cap:g})" if cap else ""),
        (r"\text{logits} = H\, W_E^\top" if tied else r"\text{logits} = H\, W_{out}") + bias,
        lambda: ([Matrix("logits", r"\text{logits}", logits(), rows=tokens, cols=vocab, point="logits", index=(0,))],
                 b.check("H·W" + ("_Eᵀ" if tied else "_out") + bias, "the model's logits", mine(), logits()), []),
    )
    if masked is not None:  # a masked-language model: each row guesses the word at its own position
        fi = tokens.index(masked) if masked in tokens else b.row(len(tokens))
        rows = [f"at '{t}'" for t in tokens]
        text = say("masked_token" if masked in tokens else "unmasked", mask=masked)
        equation, latex = "p(word at t | the rest) = softmax(logits)", r"p(\cdot \mid \text{context}) = \mathrm{softmax}(\text{logits})"
        what = f"at {masked} (position {fi})" if masked in tokens else f"at '{tokens[fi]}' (position {fi})"
    else:
        fi = b.row(len(tokens)) if len(tokens) > 1 else 0
        rows = [f"after '{t}'" for t in tokens]
        text = say("next_token")
        equation, latex = "p(next | prefix) = softmax(logits)", r"p(\cdot \mid \text{prefix}) = \mathrm{softmax}(\text{logits})"
        what = f"after '{tokens[fi]}'"
    row_logits = b.get("logits", 0, fi)  # (V,): the row worked by hand
    row = softmax(row_logits[None])[0]
    top = torch.topk(row, min(TOP_K, V))
    best = b.label(int(top.indices[0]))
    text += f" {what[0].upper() + what[1:]} the most likely word is '{best}' (p = {float(top.values[0]):.4f})."
    if not trained:
        text += say("untrained")

    def probabilities() -> tuple:
        exps = torch.exp(row_logits - row_logits.max())
        total = float(exps.sum())
        shown_terms = ", ".join(f"{vocab[i]}: {fmt(float(exps[i]))}" for i in range(V)) if V <= 16 else \
            ", ".join(f"{b.label(int(i))}: {fmt(float(exps[i]))}" for i in top.indices)
        return (
            [Matrix("p", "p", softmax(logits()), rows=rows, cols=vocab, highlight=fi),
             Matrix(f"top {len(top.values)} {what}", r"\text{top-" + str(len(top.values)) + "}", top.values[:, None],
                    rows=[f"{b.label(int(i))} (id {int(i)})" for i in top.indices], cols=["p"])],
            b.check("softmax of the recomputed logits", "torch.softmax of the model's logits",
                    softmax(mine()), torch.softmax(b.t["logits"][0].double(), dim=-1)),
            [b.worked(f"row {what}: exp(logit − max) = {shown_terms}" + (" ⋯" if V > 16 else "") + f"; sum = {fmt(total)}",
                      r"\sum_v e^{z_v - \max} = " + fmt(total), total, float(torch.exp(row_logits - row_logits.max()).sum()),
                      "the exponentials of the model's logits"),
             b.worked(f"{what} → {best}: {fmt(float(exps[int(top.indices[0])]))} / {fmt(total)} = {float(top.values[0]):.4f}",
                      f"p = {fmt(float(exps[int(top.indices[0])]))} / {fmt(total)} = {float(top.values[0]):.4f}",
                      exps[int(top.indices[0])] / total, torch.softmax(b.t["logits"][0, fi].double(), -1)[int(top.indices[0])],
                      "torch.softmax of the model's logits")])

    b.add_later(
        section, "Next-token probabilities" if masked is None else
        "The masked word's probabilities" if masked in tokens else "Each word's probabilities", text,
        equation, latex, probabilities,
    )


def pooled_step(b: Builder, hidden_point: str, tokens, section: str) -> None:
    """The sentence vector of an encoder: the pooler's, or the mean of the rows."""
    model, config = b.model, b.config
    hidden = b.get(hidden_point, 0)
    if hasattr(model, "pooled"):
        x = hidden[0] if config.pooling == "first" else hidden.mean(dim=0)
        how = "the first token's vector ([CLS])" if config.pooling == "first" else "the mean over positions"
        equation = "pooled = " + ("tanh(W·h_0 + b)" if hasattr(model, "pooler") else
                                  ("h_0" if config.pooling == "first" else "mean_t h_t"))
        latex = r"\text{pooled} = " + (r"\tanh(W h_0 + b)" if hasattr(model, "pooler") else
                                       ("h_0" if config.pooling == "first" else r"\frac{1}{T}\sum_t h_t"))
        if hasattr(model, "pooler"):
            x = torch.tanh(linear(x, model.pooler.dense))
            how += ", through the pooler's dense layer and tanh (BERT)"
        pooled = b.get("pooled", 0)
        matrix = Matrix("pooled", r"\text{pooled}", pooled[None, :], rows=["pooled"], point="pooled", index=(0,))
        check = b.check("the pooling with the module's weights", "the model's pooled", x, pooled)
        text = f"One vector for the whole sentence: {how}."
    else:
        mean = hidden.mean(dim=0)
        matrix = Matrix("mean-pooled", r"\bar h", mean[None, :], rows=["mean"])
        check = b.check("the mean of the traced rows", "anatomy.models.pool(hidden, mean)",
                        mean, f64(pool(b.t[hidden_point], None, "mean")[0]))
        equation, latex = "h̄ = (1/T) Σ_t h_t", r"\bar h = \frac{1}{T} \sum_t h_t"
        text = say("pooled_none")
    b.add(section, "Pooled sentence vector", text, equation, latex, [matrix], check)
    settings = (getattr(config, "extra", None) or {}).get("sentence_transformers")
    if settings:
        sentence_embedding_step(b, hidden_point, settings, section)


def sentence_embedding_step(b: Builder, hidden_point: str, settings: dict, section: str) -> None:
    """The vector sentence-transformers uses (MiniLM): pooled hidden states, then unit length."""
    how = settings.get("pooling", "mean")
    hidden = b.get(hidden_point, 0)
    if how == "max":
        mine = hidden.max(dim=0).values
    else:
        mine = hidden[0] if how in ("cls", "first") else hidden.mean(dim=0)
    traced = b.t[hidden_point]
    theirs = traced.max(dim=1).values if how == "max" else pool(traced, None, "first" if how in ("cls", "first") else "mean")
    equation = {"mean": "e = (1/T) Σ_t h_t", "max": "e = max_t h_t"}.get(how, "e = h_0")
    latex = {"mean": r"e = \frac{1}{T}\sum_t h_t", "max": r"e = \max_t h_t"}.get(how, "e = h_0")
    if settings.get("normalize"):
        mine = mine / mine.norm()
        theirs = torch.nn.functional.normalize(theirs, dim=-1)
        equation += ",   e ← e / ‖e‖"
        latex += r", \quad e \leftarrow e / \lVert e \rVert"
    b.add(
        section, "Sentence embedding (sentence-transformers)",
        f"The checkpoint says how its sentence vectors are made: {how} pooling over the last hidden states"
        + (", then scaled to unit length, so that a dot product is a cosine" if settings.get("normalize") else "")
        + f". This is the vector used for semantic search and similarity: {vec(mine)}.",
        equation, latex,
        [Matrix("e", "e", mine[None, :], rows=["e"], note=f"computed from {hidden_point}[0]")],
        b.check(f"{how} pooling" + (" and normalisation" if settings.get("normalize") else ""),
                "anatomy's pool() and torch's normalize on the traced hidden states", mine, f64(theirs[0])),
    )
