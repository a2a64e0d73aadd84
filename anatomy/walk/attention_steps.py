"""The attention section for one head: Q, K, V; rotation; QKᵀ; scaling; mask; softmax; A·V; W_O.

Shape letters: T query positions, S key positions (S = T in self-attention), D d_head, H heads,
K key/value heads.
"""

from __future__ import annotations

import math

import torch

from .. import masks
from ..positional import rotate_every_two, rotate_half
from .builder import Builder, fmt, products, signed, vec
from .narration import say
from .reference import f64, linear, norm, softcap, softmax
from .types import Matrix


def layer_mask(b: Builder, stack, layer: int, T: int) -> torch.Tensor:
    """The may-attend matrix [T, T] of layer `layer`, built by masks.py as the model builds it."""
    kind = b.config.layer_types[layer]
    window = b.config.sliding_window if kind == "sliding" else None
    mask, _ = masks.self_attention_mask(None, T, causal=stack.causal, window=window)
    if mask is None:
        return torch.ones(T, T, dtype=torch.bool)
    return mask.reshape(mask.shape[-2:]).bool()


def project(attn, x: torch.Tensor, which: str, head: int) -> torch.Tensor:
    """One head's queries (which="q"), keys or values from x [L, E], through the q/k norm if any: [L, D]."""
    D = attn.d_head
    rows = slice(head * D, (head + 1) * D)
    proj = getattr(attn, f"{which}_proj")
    module = getattr(attn, f"{which}_norm", None) if which in ("q", "k") else None
    if module is not None and attn.qk_norm == "across_heads":
        return norm(linear(x, proj), module)[:, rows]
    y = linear(x, proj, rows)
    return norm(y, module) if module is not None else y


def rotate(attn, x: torch.Tensor) -> torch.Tensor:
    """x [T, D] rotated as the model's rotary embedding does, from its angle tables, in float64."""
    T, r = x.shape[0], attn.rotary.rotary_dim
    cos, sin = f64(attn.rotary.cos[:T]), f64(attn.rotary.sin[:T])  # (T, r)
    turned, passed = x[:, :r], x[:, r:]
    partner = rotate_every_two(turned) if attn.rotary.interleaved else rotate_half(turned)
    return torch.cat([turned * cos + partner * sin, passed], dim=-1)


def attention_steps(b: Builder, attn, a: str, q_in: str, kv_in: str, q_tokens, kv_tokens, allowed, bias,
                    section: str, *, cross: bool) -> None:
    """Every step of head b.head: for self-attention (`allowed` the mask) or cross-attention."""
    H, K, D = attn.n_heads, attn.n_kv_heads, attn.d_head
    h = b.head
    g = h // (H // K)  # the key/value head serving query head h
    T, S = len(q_tokens), len(kv_tokens)
    xq, xkv = b.get(q_in, 0), b.get(kv_in, 0)
    # The keys and values read the memory M (cross-attention) or the same input as the queries: X̂
    # where a norm precedes the sublayer (pre-norm), X where it does not (the paper's post-norm).
    src = "M" if cross else ("X̂" if q_in.endswith("norm.out") else "X")
    q, k, v = b.get(f"{a}q", 0, h), b.get(f"{a}k", 0, g), b.get(f"{a}v", 0, g)
    q_rows, kv_rows = slice(h * D, (h + 1) * D), slice(g * D, (g + 1) * D)
    shown = [b.param(f"W_{n}", f"W_{n}", getattr(attn, f"{n}_proj").weight, rows)
             for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))] if b.small else []
    fi = min(b.row(T), T - 1)
    shown += [Matrix("Q", "Q", q, rows=q_tokens, point=f"{a}q", index=(0, h), highlight=fi),
              Matrix("K", "K", k, rows=kv_tokens, point=f"{a}k", index=(0, g)),
              Matrix("V", "V", v, rows=kv_tokens, point=f"{a}v", index=(0, g))]
    mine = torch.cat([project(attn, xq, "q", h), project(attn, xkv, "k", g), project(attn, xkv, "v", g)])
    text = say("qkv_cross" if cross else "qkv", h=h, H=H, D=D)
    if K != H:
        text += say("gqa", g=g, group=H // K, K=K, H=H)
    if attn.qk_norm != "none":
        text += say("qk_norm", how="per head" if attn.qk_norm == "per_head" else "across all heads")
    bq = " + b_q" if attn.q_proj.bias is not None else ""
    bk = " + b_k" if attn.k_proj.bias is not None else ""
    bv = " + b_v" if attn.v_proj.bias is not None else ""
    in_name = "X̂" if q_in.endswith("norm.out") else "X"
    in_latex = r"\hat X" if in_name == "X̂" else "X"
    src_latex = r"\hat X" if src == "X̂" else src
    xrow, qrow = xq[fi], q[fi]
    worked = [] if attn.qk_norm != "none" or not b.small else [b.worked(
        f"q['{q_tokens[fi]}', 0] = x · W_q[:, 0]{bq} = {products(xrow, f64(attn.q_proj.weight[h * D]))}"
        + (f" {signed(float(f64(attn.q_proj.bias)[h * D]))}" if bq else "") + f" = {fmt(float(qrow[0]))}",
        f"q_{{{fi},0}} = x_{{{fi}}} \\cdot W_q[:, 0]{bq} = {fmt(float(qrow[0]))}",
        project(attn, xrow[None], "q", h)[0, 0], qrow[0], f"the model's {a}q[0, {h}, {fi}, 0]")]
    b.add(
        section, f"Cross-attention: Q from the decoder, K and V from the encoder (head {h})" if cross
        else f"Queries, keys and values (head {h})", text,
        f"Q = {in_name}·W_q{bq},   K = {src}·W_k{bk},   V = {src}·W_v{bv}",
        f"Q = {in_latex} W_q{bq}, \\quad K = {src_latex} W_k{bk}, \\quad V = {src_latex} W_v{bv}",
        shown,
        b.check("the projections with the module's W" + (" and b" if bq or bk or bv else ""),
                f"the model's {a}q, {a}k, {a}v",
                mine, torch.cat([q, k, v])),
        worked,
    )
    if attn.rotary is not None and not cross:
        q_rot, k_rot = b.get(f"{a}q_rot", 0, h), b.get(f"{a}k_rot", 0, g)
        b.add(
            section, f"Rotary positions: rotate Q and K (head {h})", say("rotation", theta=b.config.rope_theta),
            "q̃_m = q_m ⊙ cos(mω) + rotate(q_m) ⊙ sin(mω)",
            r"\tilde q_m = q_m \odot \cos(m\omega) + \mathrm{rot}(q_m) \odot \sin(m\omega)",
            [Matrix("Q̃", r"\tilde Q", q_rot, rows=q_tokens, point=f"{a}q_rot", index=(0, h)),
             Matrix("K̃", r"\tilde K", k_rot, rows=kv_tokens, point=f"{a}k_rot", index=(0, g))],
            b.check("the rotation, in float64", f"the model's {a}q_rot, {a}k_rot",
                    torch.cat([rotate(attn, q), rotate(attn, k)]), torch.cat([q_rot, k_rot])),
        )
        q, k = q_rot, k_rot
    scores_steps(b, attn, a, q, k, v, q_tokens, kv_tokens, allowed, bias, section, cross=cross, fi=fi)
    output_projection_step(b, attn, a, q_tokens, section)


def scores_steps(b: Builder, attn, a: str, q, k, v, q_tokens, kv_tokens, allowed, bias, section: str, *,
                 cross: bool, fi: int) -> None:
    """QKᵀ, scaling, mask, softmax and A·V for head b.head, each with one row worked by hand."""
    h, D = b.head, attn.d_head
    T, S = len(q_tokens), len(kv_tokens)
    scores = b.get(f"{a}scores", 0, h)  # scaled, capped, bias added, not yet masked
    head_bias = bias[h] if bias is not None else torch.zeros(T, S, dtype=torch.float64)
    scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(D)
    raw = q @ k.T  # (T, S)
    fk = min(fi, S - 1)
    shape = (f"rectangular, {T}×{S}: one row per target position, one column per source token" if cross
             else f"{T}×{S}: one row per query, one column per key")
    dot = lambda i, j: f"q('{q_tokens[i]}') · k('{kv_tokens[j]}') = {products(q[i], k[j])} = {fmt(float(raw[i, j]))}"  # noqa: E731
    raw_scores = softcap(raw * scale, attn.softcap) + head_bias
    b.add(
        section, "Dot products QKᵀ", say("dot", shape=shape),
        "QKᵀ[i, j] = q_i · k_j = Σ_d Q[i, d] K[j, d]", r"(QK^\top)_{ij} = q_i \cdot k_j = \sum_d Q_{id} K_{jd}",
        [Matrix("QKᵀ", r"QK^\top", raw, rows=q_tokens, cols=kv_tokens, highlight=fi, operands=dot)],
        b.check("Q·Kᵀ, scaled" + (", capped" if attn.softcap else "") + (", biased" if bias is not None else ""),
                f"the model's {a}scores", raw_scores, scores),
        [b.worked(dot(fi, fk), f"q_{{{fi}}} \\cdot k_{{{fk}}} = \\sum_d Q_{{{fi}d}} K_{{{fk}d}} = {fmt(float(raw[fi, fk]))}",
                  (q[fi] * k[fk]).sum(), raw[fi, fk], "QKᵀ from the traced Q and K")],
    )
    if attn.scale is None:
        text, equation, latex = say("scale", D=D, root=math.sqrt(D)), "S = QKᵀ / √d_k", r"S = \frac{QK^\top}{\sqrt{d_k}}"
    else:
        scalar = 1.0 / attn.scale ** 2
        text, equation, latex = (say("scale_custom", scalar=scalar), f"S = QKᵀ / √{scalar:g}",
                                 r"S = \frac{QK^\top}{\sqrt{" + f"{scalar:g}" + "}}")
    if attn.softcap:
        text += say("softcap", cap=attn.softcap)
        equation, latex = equation + f",   S ← {attn.softcap:g}·tanh(S / {attn.softcap:g})", latex + r", \quad S \leftarrow c \tanh(S / c)"
    scaled = lambda i, j: f"QKᵀ['{q_tokens[i]}', '{kv_tokens[j]}'] × {scale:.4f} = {fmt(float(raw[i, j]))} × {scale:.4f}"  # noqa: E731
    shown = [Matrix("S", "S", scores, rows=q_tokens, cols=kv_tokens, point=f"{a}scores", index=(0, h), highlight=fi,
                    operands=scaled)]
    if bias is not None and b.config.pos_encoding == "relative":
        text += say("relative_bias")
        equation, latex = equation + " + B,   B[i, j] = b_h(bucket(j − i))", latex + r" + B, \quad B_{ij} = b_h(\mathrm{bucket}(j-i))"
    elif bias is not None:
        text += say("alibi_bias")
        equation, latex = equation + " + B,   B[i, j] = −m_h |i − j|", latex + r" + B, \quad B_{ij} = -m_h |i-j|"
        shown.insert(0, Matrix("B", "B", head_bias, rows=q_tokens, cols=kv_tokens))
    b.add(
        section, "Scaling by √d_k" if attn.scale is None else "Scaling the scores", text, equation, latex, shown,
        b.check("QKᵀ × scale" + (" + B" if bias is not None else ""), f"the model's {a}scores", raw_scores, scores),
        [b.worked(f"S['{q_tokens[fi]}', '{kv_tokens[fk]}'] = {fmt(float(raw[fi, fk]))} × {scale:.4f}"
                  + (f", capped: {attn.softcap:g}·tanh(· / {attn.softcap:g})" if attn.softcap else "")
                  + f" = {fmt(float(softcap(raw[fi, fk] * scale, attn.softcap)))}",
                  f"S_{{{fi},{fk}}} = {fmt(float(raw[fi, fk]))} \\times {scale:.4f}",
                  softcap(raw[fi, fk] * scale, attn.softcap), scores[fi, fk] - head_bias[fi, fk],
                  f"the model's {a}scores[0, {h}, {fi}, {fk}]")],
    )
    pattern = b.get(f"{a}pattern", 0, h)
    if allowed is None:
        allowed = torch.ones(T, S, dtype=torch.bool)
    masked = scores.masked_fill(~allowed, float("-inf"))
    if bool(allowed.all()):
        text = say("no_mask_cross" if cross else "no_mask")
        equation, latex = "M = 0 everywhere: S_masked = S", r"M = 0, \quad S_{masked} = S"
        title = "The mask (none: every source token is visible)" if cross else "The mask (none: bidirectional)"
    else:
        text = say("causal")
        if bool((~allowed & torch.tril(torch.ones(T, S, dtype=torch.bool))).any()):
            text += say("window", w=b.config.sliding_window)
        equation = "S_masked = S + M,   M[i, j] = 0 if j ≤ i else −∞"
        latex = r"S_{masked} = S + M, \quad M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}"
        title = "The causal mask"
    b.add(
        section, title, text, equation, latex,
        [Matrix("may attend", r"\text{may attend}", allowed, rows=q_tokens, cols=kv_tokens, kind="mask"),
         Matrix("S_masked", r"S_{masked}", masked, rows=q_tokens, cols=kv_tokens)],
        b.check("zero attention wherever the mask blocks", f"the model's {a}pattern",
                torch.zeros(int((~allowed).sum()), dtype=torch.float64), pattern[~allowed]),
    )
    row = masked[fi]
    live = allowed[fi]
    top = float(row[live].max())
    exps = torch.where(live, torch.exp(row - top), torch.zeros_like(row))
    total = float(exps.sum())
    exp_text = ", ".join(f"exp({fmt(float(s) - top)}) = {fmt(float(e))}" for s, e, ok in zip(row, exps, live) if ok)
    softmax_lines = [
        b.worked(f"row '{q_tokens[fi]}', less its maximum {fmt(top)}: {exp_text}; sum = {fmt(total)}",
                 r"\sum_k e^{S_{" + str(fi) + r"k} - \max} = " + fmt(total), total,
                 float(torch.exp(f64(b.t[f"{a}scores"][0, h, fi]) - top)[live].sum()), "the exponentials of the model's scores"),
        b.worked(f"A['{q_tokens[fi]}'] = each exponential / {fmt(total)} = {vec(exps / total)}",
                 f"A_{{{fi}}} = " + vec(exps / total).replace("⋯", r"\cdots"), exps / total, pattern[fi],
                 f"the model's {a}pattern[0, {h}, {fi}]"),
    ]
    b.add(
        section, "Row-wise softmax", say("softmax"),
        "A[i, j] = exp(S[i, j]) / Σ_k exp(S[i, k])", r"A_{ij} = \frac{\exp(S_{ij})}{\sum_k \exp(S_{ik})}",
        [Matrix("A", "A", pattern, rows=q_tokens, cols=kv_tokens, point=f"{a}pattern", index=(0, h), highlight=fi,
                operands=lambda i, j: f"exp(S['{q_tokens[i]}', '{kv_tokens[j]}']) / Σ_k exp(S['{q_tokens[i]}', k]) = "
                                      f"exp({fmt(float(masked[i, j]))}) / Σ_k exp(S[{i}, k])")],
        b.check("softmax of the masked scores", f"the model's {a}pattern", softmax(scores, allowed), pattern),
        softmax_lines,
    )
    z = b.get(f"{a}z", 0, slice(None), h)  # (T, D)
    weighted = lambda i, d: f"Σ_j A['{q_tokens[i]}', j] V[j, {d}] = {products(pattern[i], v[:, d])} = {fmt(float(z[i, d]))}"  # noqa: E731
    b.add(
        section, "Weighted sum of values: A·V", say("av"), f"head_{h} = A·V", f"\\mathrm{{head}}_{h} = A V",
        [Matrix(f"head_{h}", f"\\mathrm{{head}}_{h}", z, rows=q_tokens, point=f"{a}z", index=(0, slice(None), h),
                highlight=fi, operands=weighted)],
        b.check("A·V from the traced A and V", f"the model's {a}z (head {h})", pattern @ v, z),
        [b.worked(f"head_{h}['{q_tokens[fi]}', 0] = " + weighted(fi, 0),
                  f"\\mathrm{{head}}_{{{fi},0}} = \\sum_j A_{{{fi}j}} V_{{j0}} = {fmt(float(z[fi, 0]))}",
                  (pattern[fi] * v[:, 0]).sum(), z[fi, 0], f"the model's {a}z[0, {fi}, {h}, 0]")],
    )


def head_list(H: int) -> tuple[str, str]:
    """The heads inside Concat(...), as text and LaTeX: every one up to three (head_0, head_1),
    the first and the last around an ellipsis past that (head_0, …, head_8)."""
    shown = [0, None, H - 1] if H > 3 else range(H)
    text = ", ".join("…" if h is None else f"head_{h}" for h in shown)
    latex = ", ".join(r"\ldots" if h is None else r"\mathrm{head}_{" + str(h) + "}" for h in shown)
    return text, latex


def output_projection_step(b: Builder, attn, a: str, tokens, section: str) -> None:
    H, D = attn.n_heads, attn.d_head
    z_all = b.get(f"{a}z", 0)  # (T, H, D)
    concat = z_all.reshape(len(tokens), H * D)  # (T, H, D) -> (T, H*D)
    out = b.get(f"{a}out", 0)
    bias = " + b_O" if attn.o_proj.bias is not None else ""
    heads, heads_latex = head_list(H)
    shown = [Matrix("Concat(heads)", r"\mathrm{Concat}(" + heads_latex + ")", concat, rows=tokens,
                    cols=[f"h{i // D}·{i % D}" for i in range(H * D)])]
    if b.small:
        shown.append(b.param("W_O", "W_O", attn.o_proj.weight))
    shown.append(Matrix("MultiHead", r"\mathrm{MultiHead}", out, rows=tokens, point=f"{a}out", index=(0,)))
    b.add(
        section, "Concatenate the heads and project: W_O", say("concat", H=H, D=D, HD=H * D),
        f"MultiHead = Concat({heads})·W_O{bias}",
        r"\mathrm{MultiHead} = \mathrm{Concat}(" + heads_latex + r")\, W_O" + bias,
        shown,
        b.check("Concat(heads)·W_O" + bias, f"the model's {a}out", linear(concat, attn.o_proj), out),
    )


def compact_attention_step(b: Builder, attn, a: str, x_in: str, tokens, allowed, section: str,
                           bias: torch.Tensor | None = None) -> None:
    """The decoder's masked self-attention in one step, recomputed end to end for every head
    (bias [H, T, T]: ALiBi's or T5's, added to the scores)."""
    x = b.get(x_in, 0)
    H, K, D = attn.n_heads, attn.n_kv_heads, attn.d_head
    scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(D)
    heads = []
    for h in range(H):
        g = h // (H // K)
        q, k, v = project(attn, x, "q", h), project(attn, x, "k", g), project(attn, x, "v", g)
        if attn.rotary is not None:
            q, k = rotate(attn, q), rotate(attn, k)
        scores = softcap(q @ k.T * scale, attn.softcap) + (bias[h] if bias is not None else 0.0)
        heads.append(softmax(scores, allowed) @ v)
    mine = linear(torch.cat(heads, dim=-1), attn.o_proj)
    h = b.head
    b.add(
        section, "Masked self-attention over the target", say("masked_self", h=h),
        "MultiHead(X) = Concat(softmax(Q_h K_hᵀ / √d_k + M) V_h)·W_O",
        r"\mathrm{MultiHead}(X) = \mathrm{Concat}_h\!\left(\mathrm{softmax}\!\left(\frac{Q_h K_h^\top}"
        r"{\sqrt{d_k}} + M\right) V_h\right) W_O",
        [b.matrix("A", "A", f"{a}pattern", (0, h), rows=tokens, cols=tokens),
         b.matrix("MultiHead", r"\mathrm{MultiHead}", f"{a}out", (0,), rows=tokens)],
        b.check("every head recomputed from X with the module's weights", f"the model's {a}out",
                mine, b.get(f"{a}out", 0)),
    )
