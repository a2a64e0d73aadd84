"""The source texts' own worked examples, walked with their printed numbers.

The numbers are data (walk/data/*.json), copied from the sources as printed. Each step recomputes
what the source computed and checks it against the source's printed result, to the precision it
was printed with; where a source departs from its own formulas, the step says so plainly.

    anatomy walk --list-examples
    anatomy walk --example armas
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..checkpoints.toys import SENTENCE, TOYS, article_words, build_toy, sentence_vocab, toy_tokenizer
from .builder import fmt, products, vec
from .reference import compare, softmax
from .sources import EXAMPLES, load
from .types import Matrix, Step, Worked
from .walkthrough import Walkthrough


def T(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def cite(data: dict) -> str:
    year = f" ({data['year']})" if data.get("year") else ""
    if data["author"].startswith("the "):
        return data["author"]
    return f"{data['author']}, \u201c{data['title']}\u201d{year}"


class Steps:
    """Collects an example's steps: each with its matrices, worked lines and check."""

    def __init__(self):
        self.steps: list[Step] = []

    def add(self, section: str, title: str, text: str, equation: str, latex: str, matrices=(), check=None,
            worked=()) -> None:
        self.steps.append(Step(section, title, text, equation, latex, list(matrices), check, len(self.steps) + 1,
                               list(worked)))


def printed(what: str, mine, theirs, digits: int) -> object:
    """A check against a source's printed value, to the precision it printed (plus the round-off of
    the inputs it printed at the same precision)."""
    return compare("this line", f"the printed {what}", T(mine) if not torch.is_tensor(mine) else mine,
                   T(theirs) if not torch.is_tensor(theirs) else theirs, tolerance=1.5 * 10 ** -digits)


def armas() -> Walkthrough:
    d = load("armas")
    s = Steps()
    tokens, fi = d["tokens"], d["focus"]
    words = article_words(SENTENCE)
    ids = sentence_vocab().encode(words)
    s.add("Input", "The vocabulary and the ids",
          "The article appends <SOS> and <EOS>, sorts the distinct words and numbers them: stoi = {w: i}. "
          "anatomy's toy builds the same vocabulary, and gets the article's ids [1, 3, 4, 6, 5, 2, 0].",
          "ids = [stoi[w] for w in '<SOS> Hello World, this is Alejandro! <EOS>'.split(' ')]",
          r"\text{ids} = (" + ", ".join(map(str, ids)) + ")",
          [Matrix("ids", r"\text{ids}", T([ids]), rows=["id"], cols=words, kind="int", note="anatomy.checkpoints.toys")],
          compare("the toy's vocabulary", "the article's printed ids [1, 3, 4, 6, 5, 2, 0]", T(ids), T([1, 3, 4, 6, 5, 2, 0])))
    e3, e3_added, p3, x3 = T(d["e3"]), T(d["e3_as_added"]), T(d["p3"]), T(d["x3"])
    article_p = [math.sin(3 / 10000 ** (2 * i / 4)) if i % 2 == 0 else math.cos(3 / 10000 ** (2 * i / 4)) for i in range(4)]
    paper_p = [math.sin(3 / 10000 ** (2 * (i // 2) / 4)) if i % 2 == 0 else math.cos(3 / 10000 ** (2 * (i // 2) / 4)) for i in range(4)]
    s.add("Input", "Positional encoding p₃ of 'is'",
          "The article writes ω_i = 1/10000^(2i/d) with i the dimension (i = 0, 1, 2, 3). The paper indexes the "
          "frequency by the pair of dimensions: ω = 1/10000^(2⌊i/2⌋/d), so dimensions 0 and 1 share one frequency. "
          f"By the article's formula p₃ = {vec(T(article_p))}; by the paper's, p₃ = {vec(T(paper_p))}. The article "
          f"prints p₃ = {d['p3']}, which matches neither entry for entry (its first entry, sin 3, is common to all "
          "three); the steps below use the printed p₃, so as to reproduce the article's x₃.",
          "p₃[i] = sin(3 / 10000^(2i/4)) for even i, cos(3 / 10000^(2i/4)) for odd i   (the article)",
          r"p_3^{(i)} = \begin{cases} \sin(\omega_i t) & i \text{ even} \\ \cos(\omega_i t) & i \text{ odd} \end{cases}, \quad \omega_i = 10000^{-2i/d}",
          [Matrix("p₃ (printed)", "p_3", p3[None], rows=["p₃"], note="as printed in the article"),
           Matrix("p₃ (paper)", "p_3", T([paper_p]), rows=["p₃"], note="Vaswani et al. 2017, pair-indexed")],
          printed("first entry of p₃, sin(3)", math.sin(3), p3[0], 8))
    s.add("Input", "x₃ = e₃ + p₃",
          f"The token embedding of 'is' is printed as e₃ = {d['e3']}, but the sum adds 0.03 in the last entry, where "
          f"e₃ has −0.3: with −0.3, x₃ would end in {fmt(float(e3[3] + p3[3]))}. The article's x₃ = {d['x3']} is "
          "e₃ with 0.03, plus the printed p₃.",
          "x₃ = e₃ + p₃", r"\vec{x}_3 = \vec{e}_3 + \vec{p}_3",
          [Matrix("e₃ (as added)", "e_3", e3_added[None], rows=["e₃"], note="the article's sum"),
           Matrix("x₃", "x_3", x3[None], rows=["x₃"], note="as printed", highlight=0)],
          printed("x₃", e3_added + p3, x3, 4),
          [Worked(f"x₃[{i}] = {fmt(float(e3_added[i]))} {'−' if p3[i] < 0 else '+'} {abs(float(p3[i])):.8f} "
                  f"= {fmt(float(e3_added[i] + p3[i]))}",
                  f"x_3^{{({i})}} = {fmt(float(e3_added[i] + p3[i]))}", printed(f"x₃[{i}]", e3_added[i] + p3[i], x3[i], 4))
           for i in range(4)])
    W = {n: T(d[n]) for n in ("W_Q", "W_K", "W_V", "W_Q_in_q3")}
    for name, vector, note in (
        ("v", "v3", f"The article writes v₃ = W_V·x₃ but computes x₃·W_V (a row vector times the matrix): W_V·x₃ "
                    f"would give {vec(W['W_V'] @ x3)}."),
        ("q", "q3", "The article shows two different W_Q: the one it defines (used here, which reproduces its q₃) "
                    f"and, inside q₃'s equation, another one (equal to its W_K), with which x₃·W = {vec(x3 @ W['W_Q_in_q3'])} = k₃."),
        ("k", "k3", "Inside k₃'s equation the article prints the first W_Q; the W_K it defines is the one that "
                    "reproduces its k₃."),
    ):
        weight = W[f"W_{name.upper()}"]
        result = x3 @ weight
        s.add("Self-attention", f"{name}₃ = x₃·W_{name.upper()}", note,
              f"{name}₃ = x₃·W_{name.upper()}", f"\\vec{{{name}}}_3 = \\vec{{x}}_3 W_{{{name.upper()}}}",
              [Matrix(f"W_{name.upper()}", f"W_{{{name.upper()}}}", weight, note="as printed in the article"),
               Matrix(f"{name}₃", f"{name}_3", T(d[vector])[None], rows=[f"{name}₃"], note="as printed", highlight=0)],
              printed(f"{name}₃", result, T(d[vector]), 4),
              [Worked(f"{name}₃[{j}] = {products(x3, weight[:, j])} = {fmt(float(result[j]))}",
                      f"{name}_3^{{({j})}} = \\sum_i x_3^{{(i)}} W_{{i{j}}} = {fmt(float(result[j]))}",
                      printed(f"{name}₃[{j}]", result[j], T(d[vector])[j], 4)) for j in range(4)])
    q3, k3, v3 = x3 @ W["W_Q"], x3 @ W["W_K"], x3 @ W["W_V"]  # unrounded, as the article computed them
    dot = float(q3 @ k3)
    s.add("Self-attention", "The attention score a₃,₃ = q₃·k₃ / √d_k",
          f"The second vector of the article's dot product holds v₃'s numbers {d['v3']}, but its result 28.7448 is "
          f"q₃·k₃ (q₃·v₃ would be {fmt(float(q3 @ v3))}). Divided by √d_k = √4 = 2: 14.3724.",
          "a₃,₃ = q₃·k₃ / √d_k", r"a_{3,3} = \frac{\vec{q}_3 \cdot \vec{k}_3}{\sqrt{d_k}}", [],
          printed("a₃,₃", dot / 2, d["a33"], 4),
          [Worked(f"q₃·k₃ = {products(q3, k3)} = {fmt(dot)}", r"\vec{q}_3 \cdot \vec{k}_3 = " + fmt(dot),
                  printed("q₃·k₃", dot, d["q3_dot_k3"], 3)),
           Worked(f"{fmt(dot)} / √4 = {fmt(dot / 2)}", r"\frac{" + fmt(dot) + "}{2} = " + fmt(dot / 2),
                  printed("a₃,₃", dot / 2, d["a33"], 4))])
    a3 = T(d["a3"])
    e = torch.exp(a3 - a3.max())
    s.add("Self-attention", "α₃ = softmax(a₃)",
          "The softmax of the row of scores of 'is' reproduces the article's attention weights.",
          "α₃ = softmax(a₃)", r"\vec{\alpha}_3 = \mathrm{softmax}(\vec{a}_3)",
          [Matrix("α₃", r"\alpha_3", softmax(a3)[None], rows=["is"], cols=tokens, highlight=0, note="recomputed")],
          printed("α₃", softmax(a3), T(d["alpha3"]), 4),
          [Worked("exp(a − max) = " + ", ".join(f"{fmt(float(x))}" for x in e) + f"; sum = {fmt(float(e.sum()))}",
                  r"\sum_j e^{a_{3j} - \max} = " + fmt(float(e.sum())), printed("softmax", e / e.sum(), T(d["alpha3"]), 4))])
    A, V = T(d["A"]), T(d["V"])
    s.add("Self-attention", "O = A·V",
          "Each row of the output mixes the rows of V with that row's weights; the article prints it to two decimals.",
          "O = A·V", r"O = A V",
          [Matrix("A", "A", A, rows=tokens, cols=tokens, note="as printed", highlight=fi),
           Matrix("V", "V", V, rows=tokens, note="as printed"),
           Matrix("O", "O", A @ V, rows=tokens, note="recomputed from the printed A and V", highlight=fi)],
          printed("O", A @ V, T(d["O"]), 2),
          [Worked(f"O['is', 0] = {products(A[fi], V[:, 0])} = {fmt(float(A[fi] @ V[:, 0]))}",
                  r"O_{3,0} = \sum_j A_{3j} V_{j0}", printed("O['is', 0]", A[fi] @ V[:, 0], T(d["O"])[fi, 0], 2))])
    X = T(d["X_layernorm"])
    row = X[fi]
    mean, var = row.mean(), row.var(unbiased=False)
    s.add("Residuals and LayerNorm", "LayerNorm of each row",
          "Each row is shifted to mean 0 and scaled to variance 1 (ε = 1e-5, γ = 1, β = 0 as PyTorch initialises them).",
          "LayerNorm(x) = (x − mean(x)) / √(var(x) + ε)", r"\mathrm{LayerNorm}(x) = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}",
          [Matrix("LayerNorm(X)", r"\mathrm{LayerNorm}(X)", F.layer_norm(X, (4,)), rows=tokens, highlight=fi, note="recomputed")],
          printed("LayerNorm(X)", F.layer_norm(X, (4,)), T(d["layernorm"]), 4),
          [Worked(f"row 'is': mean = {fmt(float(mean))}, variance = {float(var):.6f}, normalised = "
                  f"{vec((row - mean) / torch.sqrt(var + 1e-5))}", r"\mu = " + fmt(float(mean)),
                  printed("LayerNorm row of 'is'", (row - mean) / torch.sqrt(var + 1e-5), T(d["layernorm"])[fi], 4))])
    n = len(d["decoder_tokens"])
    S = torch.full((n, n), float("-inf"), dtype=torch.float64)
    for i, r in enumerate(d["decoder_scores"]):
        S[i, : len(r)] = T(r)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    mine = softmax(S / math.sqrt(n), allowed)
    by_dk = softmax(S / math.sqrt(d["d_k"]), allowed)
    s.add("Decoder", "Masked self-attention of the decoder",
          "The text divides by √d_k, but the code divides by K.shape[1] ** 0.5, which for K of shape (B, T, C) is "
          f"√T = √{n}: the printed weights are softmax(S / √{n}). With √d_k = 2 the row of 'Alejandro' would be "
          f"{vec(by_dk[3, :4])}.",
          "A = softmax((QKᵀ + M) / √5)", r"A = \mathrm{softmax}\left(\frac{QK^\top + M}{\sqrt{5}}\right)",
          [Matrix("A", "A", mine, rows=d["decoder_tokens"], cols=d["decoder_tokens"], highlight=3, note="recomputed")],
          printed("decoder attention weights", mine, T(d["decoder_A"]), 4))
    return Walkthrough(s.steps, None, None, 0, 0, tokens, None, "armas", source=cite(d))


def notes() -> Walkthrough:
    d = load("anatomy-notes")
    s = Steps()
    tokens = d["tokens"]
    E, Wq, Wk, Wv = T(d["E"]), T(d["W_q"]), T(d["W_k"]), T(d["W_v"])
    s.add("Attention", "1. The embedding matrix E (5 × 4)", d["note"], "E ∈ ℝ^(5×4)", r"E \in \mathbb{R}^{5 \times 4}",
          [Matrix("E", "E", E, rows=tokens, note="the notes' shape, round numbers")])
    s.add("Attention", "2. The weight matrices W_q, W_k, W_v (4 × 2)",
          "Each maps a 4-dimensional embedding to a 2-dimensional query, key or value.",
          "W_q, W_k, W_v ∈ ℝ^(4×2)", r"W_q, W_k, W_v \in \mathbb{R}^{4 \times 2}",
          [Matrix("W_q", "W_q", Wq), Matrix("W_k", "W_k", Wk), Matrix("W_v", "W_v", Wv)])
    Q, K, V = E @ Wq, E @ Wk, E @ Wv
    s.add("Attention", "3. Q = E W_q, K = E W_k, V = E W_v (5 × 2)", "One row per token, one column per dimension.",
          "Q = E W_q,  K = E W_k,  V = E W_v", r"Q = E W_q, \quad K = E W_k, \quad V = E W_v",
          [Matrix("Q", "Q", Q, rows=tokens, highlight=0), Matrix("K", "K", K, rows=tokens), Matrix("V", "V", V, rows=tokens)],
          compare("E·W by sums of products", "torch.nn.functional.linear", torch.cat([Q, K, V]),
                  torch.cat([F.linear(E, W.T) for W in (Wq, Wk, Wv)])),
          [Worked(f"q₁₁ = {products(E[0], Wq[:, 0])} = {fmt(float(Q[0, 0]))}", r"q_{11} = \sum_i e_{1i} w^q_{i1}",
                  compare("this line", "Q[0, 0]", (E[0] * Wq[:, 0]).sum(), F.linear(E, Wq.T)[0, 0]))])
    scores = Q @ K.T
    A = softmax(scores / math.sqrt(2))
    s.add("Attention", "4. Attention scores: softmax(QKᵀ / √d), d = 2",
          "Entry (i, j) of QKᵀ is q_i1 k_j1 + q_i2 k_j2; each row is divided by √2 and turned into probabilities.",
          "A = softmax(QKᵀ / √2)", r"A = \mathrm{Softmax}\left(\frac{QK^T}{\sqrt{2}}\right)",
          [Matrix("QKᵀ", r"QK^T", scores, rows=tokens, cols=tokens, highlight=0),
           Matrix("A", "A", A, rows=tokens, cols=tokens, highlight=0)],
          compare("softmax(QKᵀ/√2)", "torch.softmax", A, torch.softmax(scores / math.sqrt(2), -1)),
          [Worked(f"q₁₁k₁₁ + q₁₂k₁₂ = {products(Q[0, :2], K[0, :2])} = {fmt(float(scores[0, 0]))}", r"q_{11}k_{11} + q_{12}k_{12}",
                  compare("this line", "QKᵀ[0, 0]", Q[0, 0] * K[0, 0] + Q[0, 1] * K[0, 1], scores[0, 0]))])
    out = A @ V
    s.add("Attention", "5. The output A V (5 × 2)",
          "The contextualised embedding of each token is a linear combination of all the value rows, weighted by "
          "its attention scores.",
          "Output = A V", r"\text{Output} = A V",
          [Matrix("Output", r"\text{Output}", out, rows=tokens, highlight=0)],
          compare("A·V", "torch's scaled_dot_product_attention(Q, K, V)", out,
                  F.scaled_dot_product_attention(Q[None], K[None], V[None])[0]),
          [Worked(f"a₁₁v₁₁ + a₁₂v₂₁ + ⋯ + a₁₅v₅₁ = {products(A[0], V[:, 0])} = {fmt(float(out[0, 0]))}",
                  r"a_{11}v_{11} + a_{12}v_{21} + \cdots + a_{15}v_{51}",
                  compare("this line", "Output[0, 0]", (A[0] * V[:, 0]).sum(), out[0, 0]))])
    return Walkthrough(s.steps, None, None, 0, 0, tokens, None, "notes", source=cite(d))


def anasashb() -> Walkthrough:
    d = load("anasashb")
    s = Steps()
    tokens, cols = d["tokens"], [str(c) for c in d["printed_columns"]]
    shown = "columns 0, 1, 2, 297 and 298 of 300, as the notebook printed them"
    m = lambda name, key, **kw: Matrix(name, name, T(d[key]), rows=tokens, cols=cols, note=shown, **kw)  # noqa: E731
    s.add("Encoder", "Step 0) The input X (t × d = 4 × 300)",
          "Four tokens, random embeddings of width d = 300; a single head with d_model = d_q = d_k = d_v.",
          "X ∈ ℝ^(t×d)", r"X \in \mathbb{R}^{t \times d}", [m("X", "X")])
    s.add("Encoder", "Step 1) Q, K and V", "Three d × d projections of the same X.",
          "Q = XW^Q,  K = XW^K,  V = XW^V", r"Q = XW^{Q}, \quad K = XW^{K}, \quad V = XW^{V}", [m("V", "V")])
    S, A = T(d["scaled_attention"]), T(d["normalized_attention"])
    s.add("Encoder", "Step 2) Scaled attention scores", "QKᵀ divided by √d = √300.",
          "scaled_attention = QKᵀ / √d", r"\frac{QK^{T}}{\sqrt{d}}",
          [Matrix("scaled_attention", "S", S, rows=tokens, cols=tokens, note="as printed")])
    s.add("Encoder", "Step 3) Normalised attention scores",
          "The softmax of each printed row reproduces the printed weights; the scores are tiny, so the weights "
          "are all close to 1/4.",
          "normalized_attention = softmax(QKᵀ / √d)", r"\mathrm{softmax}\left(\frac{QK^{T}}{\sqrt{d}}\right)",
          [Matrix("normalized_attention", "A", softmax(S), rows=tokens, cols=tokens, note="recomputed", highlight=0)],
          printed("normalised attention", softmax(S), A, 7))
    Y = A @ T(d["V"])
    s.add("Encoder", "Step 4) The attention output Y = A V",
          "Each column of Y depends only on the same column of V, so the printed columns of V and A reproduce the "
          "printed columns of Y.",
          "Y = softmax(QKᵀ / √d) V", r"Y = \mathrm{softmax}\left(\frac{QK^{T}}{\sqrt{d}}\right)V",
          [Matrix("Y", "Y", Y, rows=tokens, cols=cols, note="recomputed from the printed A and V columns")],
          printed("attention output", Y, T(d["attention_output"]), 7))
    s.add("Encoder", "Step 5) Residual connection and LayerNorm",
          "LayerNorm (ε = 1e-6) needs the mean and variance of all 300 columns of each row, which the notebook does "
          "not print: these values are shown as printed.",
          "O = LayerNorm(Y + X)", r"O = \mathrm{LayerNorm}(Y+X)", [m("O", "attention_add_norm")])
    s.add("Encoder", "Step 6) Position-wise feed-forward network",
          "Widen to 4d = 1200 with ReLU, project back to d = 300 (random weights, not printed).",
          "FFN(O) = max(0, OW₁ + b₁)W₂ + b₂", r"FFN(O) = \max(0, OW_1 + b_1)W_2 + b_2", [m("FFN(O)", "ffn_output")])
    s.add("Encoder", "Step 7) Residual connection and LayerNorm again", "The encoder layer's output.",
          "encoder_output = LayerNorm(FFN(O) + O)", r"\mathrm{LayerNorm}(FFN(O)+O)", [m("encoder_output", "encoder_output")])
    return Walkthrough(s.steps, None, None, 0, 0, tokens, None, "anasashb", source=cite(d))


WALKS = {"armas": armas, "anasashb": anasashb, "notes": notes}


def example_walk(name: str) -> Walkthrough:
    """The worked example `name` (one of EXAMPLES) as a Walkthrough; ValueError names the choices."""
    if name not in WALKS:
        raise ValueError(f"unknown example {name!r}; choose one of {', '.join(EXAMPLES)}")
    return WALKS[name]()


def toy_example(name: str = "toy", **overrides):
    """(model, ids, kwargs) for a trained toy on its own text: `walkthrough(model, ids, **kwargs)`."""
    toy, tokenizer = TOYS[name], toy_tokenizer(name)
    model = build_toy(name, **overrides)
    ids, target = tokenizer.encode_for(model.config, toy.text, toy.target)
    options = {"vocab": lambda i: tokenizer.labels([i])[0], "model_name": name, "task": toy.task}
    if target is not None:
        options.update(target_ids=target, target_tokens=tokenizer.labels(target))
    if toy.arch == "encoder":
        options["mask_token"] = "<MASK>"
    return model, ids, dict(options, tokens=tokenizer.labels(ids))
