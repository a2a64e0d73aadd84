"""The input section: tokens, one-hot vectors, the embedding lookup, positions, X.

Shape letters: T positions, V vocabulary, E d_model.
"""

from __future__ import annotations

import torch
from torch import nn

from .builder import FULL_VOCAB, Builder, fmt, signed, vec
from .narration import say
from .reference import f64, linear, norm
from .types import Matrix


def input_steps(b: Builder, stack: nn.Module, p: str, ids: list[int], tokens: list[str], section: str,
                one_hot: bool = True) -> None:
    """Steps from the ids to the first layer's input X, for the stack whose trace prefix is `p`."""
    config = b.config
    T, V, E = len(ids), config.vocab_size, config.d_model
    ids_t = torch.tensor(ids)
    vocab = b.vocabulary(V)
    b.add(
        section, "Tokens and ids", say("tokens", T=T, V=V),
        "ids = [stoi[token] for token in tokens]",
        r"\text{ids} = (" + (", ".join(map(str, ids)) if T <= 16 else  # a long text's ids: its ends (all in the matrix)
                             ", ".join(map(str, ids[:6])) + r", \ldots, " + ", ".join(map(str, ids[-3:]))) + ")",
        [Matrix("ids", r"\text{ids}", ids_t[None, :].to(torch.float64), rows=["id"], cols=list(tokens), kind="int",
                note="the input")],
    )
    scale = stack.embed_scale
    embed = b.get(f"{p}embed", 0)  # (T, E)
    lookup = f64(stack.token_embedding.weight[ids_t]) * scale  # (T, E): rows ids of W_E
    scale_text = f" × √d_model (= {scale:.4f}, the paper §3.4)" if scale != 1.0 else ""
    scale_latex = r" \sqrt{d_{model}}" if scale != 1.0 else ""
    shown_ids = list(range(V)) if V <= FULL_VOCAB else sorted(set(ids))
    # O · W_E over the columns of O that hold a 1: every other term of the sum is 0 · w, the same sum
    # without reading (or converting to float64) the rest of a 49,152-row table
    table = f64(stack.token_embedding.weight[shown_ids])  # (shown, E)
    shown_labels = vocab if V <= FULL_VOCAB else [f"{vocab[i]} ({i})" for i in shown_ids]
    subset = "" if V <= FULL_VOCAB else f"; only the {len(shown_ids)} of {V} entries this sentence uses"
    if one_hot:
        # O's columns of the shown entries (every column of a small vocabulary): the others are all 0
        onehot = (ids_t[:, None] == torch.tensor(shown_ids)[None, :]).to(torch.float64)  # (T, shown)
        b.add(
            section, "One-hot vectors", say("one_hot", V=V),
            "O[t, v] = 1 if v = ids[t] else 0,   O ∈ {0,1}^(T×V)",
            r"O_{t,v} = [v = \text{ids}_t], \quad O \in \{0,1\}^{" + f"{T} \\times {V}" + "}",
            [Matrix("O", "O", onehot, rows=list(tokens), cols=shown_labels, kind="int",
                    note="built from the ids" + subset + (" (every other column is 0)" if subset else ""))],
            b.check("O · W_E" + (" · √d_model" if scale != 1.0 else ""), f"the model's {p}embed",
                    onehot @ table * scale, embed),
        )
    b.add(
        section, "Embedding lookup", say("lookup", V=V, E=E),
        "E = O · W_E" + scale_text, r"E = O\, W_E" + scale_latex,
        [b.param("W_E", "W_E", stack.token_embedding.weight, transpose=False, labels=shown_labels,
                 rows=None if V <= FULL_VOCAB else shown_ids, note=subset),
         Matrix("E", "E", embed, rows=list(tokens), point=f"{p}embed", index=(0,))],
        b.check("rows ids of W_E" + (" × √d_model" if scale != 1.0 else ""), f"the model's {p}embed", lookup, embed),
    )
    if hasattr(stack, "project_in"):
        projected = b.get(f"{p}project_in.out", 0)
        b.add(
            section, "Projection to d_model",
            f"This model's embeddings are {stack.project_in.in_features} wide; one learned matrix (no bias) "
            f"widens them to d_model = {E} before anything else (OPT).",
            "E ← E·W_in", r"E \leftarrow E\, W_{in}",
            [Matrix("E·W_in", r"E W_{in}", projected, rows=list(tokens), point=f"{p}project_in.out", index=(0,))],
            b.check("E·W_in with the module's weight", f"the model's {p}project_in.out",
                    linear(embed, stack.project_in), projected),
        )
        embed = projected
    position_step(b, stack, p, tokens, section)
    has_p = hasattr(stack, "position_embedding")
    parts, total = (["E", "P"] if has_p else ["E"]), embed
    if has_p:
        total = total + b.get(f"{p}pos_embed", 0)
    if hasattr(stack, "token_type_embedding"):
        types = b.get(f"{p}type_embed", 0)
        type_table = f64(stack.token_type_embedding.weight)
        b.add(
            section, "Token-type embeddings", say("token_types"),
            "T_type = W_type[0]  for every position", r"T = W_{type}[0]",
            [Matrix("T_type", "T", types, rows=list(tokens), point=f"{p}type_embed", index=(0,))],
            b.check("row 0 of W_type", f"the model's {p}type_embed", type_table[[0] * T], types),
        )
        parts.append("T")
        total = total + types
    x0 = f"{p}blocks.0.resid_pre"
    x = b.get(x0, 0)
    equation = latex = "X = " + " + ".join(parts)
    text = say("input_sum") if has_p else say("input_no_p")
    recomputed = total
    if hasattr(stack, "embed_norm"):
        equation = f"X = LayerNorm({' + '.join(parts)})"
        latex = r"X = \mathrm{LayerNorm}(" + " + ".join(parts) + ")"
        text += say("embed_norm")
        recomputed = norm(total, stack.embed_norm)
    focus = b.row(T)
    worked = []
    if has_p and not hasattr(stack, "embed_norm") and len(parts) == 2:
        e, pe = embed[focus], total[focus] - embed[focus]
        for d in range(min(E, 4)):
            worked.append(b.worked(
                f"x['{tokens[focus]}', {d}] = e + p = {fmt(float(e[d]))} {signed(float(pe[d]))} "
                f"= {fmt(float(e[d] + pe[d]))}",
                f"x_{{{focus},{d}}} = {fmt(float(e[d]))} + ({fmt(float(pe[d]))}) = {fmt(float(e[d] + pe[d]))}",
                e[d] + pe[d], x[focus, d], f"the model's {x0}[0, {focus}, {d}]"))
        if E > 4:
            text += f" For '{tokens[focus]}' at position {focus}: {vec(e)} + {vec(pe)} = {vec(x[focus])}."
    b.add(
        section, "Input to the first layer: " + equation, text, equation, latex,
        [Matrix("X", "X", x, rows=list(tokens), point=x0, index=(0,), highlight=focus)],
        b.check(equation.split("= ", 1)[1], f"the model's {x0} (the input of layer 0)", recomputed, x),
        worked,
    )


def position_step(b: Builder, stack: nn.Module, p: str, tokens: list[str], section: str) -> None:
    """The positional-encoding step, by config.pos_encoding."""
    config = b.config
    T, E = len(tokens), config.d_model
    rows = [f"{t}: {tok}" for t, tok in enumerate(tokens)]
    kind = config.pos_encoding
    title = "Positional encoding"
    if kind == "sinusoidal":
        pe = b.get(f"{p}pos_embed", 0)
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
        b.add(
            section, title, say("sinusoidal", layout=layout, last=E // 2 - 1),
            f"PE(pos, 2i) = sin(pos / 10000^(2i/{E})),   PE(pos, 2i+1) = cos(pos / 10000^(2i/{E}))",
            r"PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/" + str(E) + r"}}\right), \quad "
            r"PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/" + str(E) + r"}}\right)",
            [Matrix("P", "P", pe, rows=rows, point=f"{p}pos_embed", index=(0,))],
            b.check("the formula, in float64", f"the model's {p}pos_embed", mine, pe),
        )
    elif kind == "learned":
        pe = b.get(f"{p}pos_embed", 0)
        table = f64(stack.position_embedding.weight)
        offset = stack.position_embedding.offset  # position p reads row p + offset (OPT, RoBERTa)
        rows_text = f"rows {offset} … T−1+{offset}" if offset else "rows 0 … T−1"
        b.add(
            section, title, say("learned", n=config.max_seq_len), f"P = W_P[{offset} … T−1+{offset}]" if offset else "P = W_P[0 … T−1]",
            r"P = W_P[" + (f"{offset} + " if offset else "") + r"0 \ldots T-1]",
            [Matrix("P", "P", pe, rows=rows, point=f"{p}pos_embed", index=(0,))],
            b.check(f"{rows_text} of W_P", f"the model's {p}pos_embed", table[offset:offset + T], pe),
        )
    elif kind == "rotary":
        b.add(section, title, say("rotary"), "no P: X = E;  q_m ← R(m θ) q_m,  k_n ← R(n θ) k_n",
              r"X = E, \quad q_m \leftarrow R_{m\theta}\, q_m, \quad k_n \leftarrow R_{n\theta}\, k_n")
    elif kind == "alibi":
        b.add(section, title, say("alibi"), "no P: X = E;  S[i, j] += −m_h |i − j|",
              r"X = E, \quad S_{ij} \mathrel{+}= -m_h\,|i-j|")
    else:
        b.add(section, title, say("no_positions"), "no P: X = E", r"X = E")
