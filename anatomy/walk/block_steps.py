"""One layer: its norms and residual sums in the order config.norm_position computes them, and
the feed-forward network (or mixture of experts), each with one row or neuron worked by hand.

Shape letters: T positions, E d_model, F d_ff, N experts.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import LayerNorm
from .attention_steps import attention_steps, compact_attention_step, layer_mask
from .builder import Builder, fmt, products, signed, sum_text, vec
from .narration import say
from .reference import activation, f64, gain, linear, norm, softmax
from .types import Matrix, Worked

SUBLAYER_WORDS = {"attn": "attention", "cross_attn": "cross-attention", "mlp": "feed-forward network"}
SUBLAYER_NAMES = {"attn": "Attention", "cross_attn": "CrossAttention", "mlp": "FFN"}


def norm_name(module: nn.Module) -> str:
    return "LayerNorm" if isinstance(module, LayerNorm) else "RMSNorm"


def norm_parameters(module: nn.Module) -> str:
    """The parameters a norm has, in words: LayerNorm's "γ, β and ε", RMSNorm's "γ and ε"."""
    return "γ, β and ε" if getattr(module, "bias", None) is not None else "γ and ε"


def norm_worked(b: Builder, x: torch.Tensor, module: nn.Module, result: torch.Tensor, token: str,
                against: str) -> list[Worked]:
    """LayerNorm (or RMSNorm) of one row by hand: mean, variance, normalised row, then γ and β."""
    E = x.numel()
    g = gain(module)
    if isinstance(module, LayerNorm):
        mean = x.sum() / E
        var = ((x - mean) ** 2).sum() / E
        normalised = (x - mean) / torch.sqrt(var + module.eps)
        beta = f64(module.bias)
        return [
            b.worked(f"row '{token}': mean = ({sum_text(x)}) / {E} = {fmt(float(mean))}",
                     r"\mu = \frac{1}{" + str(E) + r"} \sum_d x_d = " + fmt(float(mean)), mean, x.mean(), "torch.mean of the row"),
            b.worked(f"variance = Σ (x {signed(-float(mean))})² / {E} = {float(var):.6f}",
                     r"\sigma^2 = \frac{1}{" + str(E) + r"} \sum_d (x_d - \mu)^2 = " + f"{float(var):.6f}",
                     var, x.var(unbiased=False), "torch.var(unbiased=False) of the row"),
            b.worked(f"normalised = (x {signed(-float(mean))}) / √({float(var):.6f} + {module.eps:g}) = {vec(normalised)}",
                     r"\hat x = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}", normalised,
                     torch.nn.functional.layer_norm(x, (E,), eps=module.eps), "torch's layer_norm without γ, β"),
            b.worked(f"× γ {vec(g)}" + (f" + β {vec(beta)}" if module.bias is not None else "")
                     + f" = {vec(normalised * g + beta)}",
                     r"\gamma \odot \hat x" + (r" + \beta" if module.bias is not None else ""),
                     normalised * g + beta, result, against),
        ]
    ms = (x ** 2).sum() / E
    normalised = x / torch.sqrt(ms + module.eps)
    return [
        b.worked(f"row '{token}': mean of squares = Σ x² / {E} = {float(ms):.6f}",
                 r"\frac{1}{" + str(E) + r"} \sum_d x_d^2 = " + f"{float(ms):.6f}", ms, (x ** 2).mean(), "torch.mean of x²"),
        b.worked(f"x / √({float(ms):.6f} + {module.eps:g}) × γ = {vec(normalised * g)}",
                 r"\frac{x}{\sqrt{\overline{x^2} + \epsilon}} \odot \gamma", normalised * g, result, against),
    ]


def norm_step(b: Builder, section: str, title: str, text: str, module, x_point: str, out_point: str, tokens,
              what: str) -> None:
    """A norm applied on its own (pre-norm, an output norm, a final norm): X̂ = Norm(X)."""
    name = norm_name(module)
    x, out = b.get(x_point, 0), b.get(out_point, 0)
    fi = b.row(len(tokens))
    b.add(
        section, title, text, f"{what} = {name}(X)", f"{what} = \\mathrm{{{name}}}(X)".replace("X̂", r"\hat X"),
        [b.matrix(what, what.replace("X̂", r"\hat X"), out_point, (0,), rows=tokens, highlight=fi)],
        b.check(f"{name}(X) with the module's {norm_parameters(module)}", f"the model's {out_point}", norm(x, module), out),
        norm_worked(b, x[fi], module, out[fi], tokens[fi], f"the model's {out_point}[0, {fi}]"),
    )


def residual_worked(b: Builder, x: torch.Tensor, y: torch.Tensor, result: torch.Tensor, token: str,
                    against: str) -> list[Worked]:
    """x + sublayer(x) for one row, component by component (the first four)."""
    return [b.worked(f"'{token}'[{d}]: {fmt(float(x[d]))} {signed(float(y[d]))} = {fmt(float(x[d] + y[d]))}",
                     f"{fmt(float(x[d]))} + ({fmt(float(y[d]))}) = {fmt(float(x[d] + y[d]))}",
                     x[d] + y[d], result[d], against) for d in range(min(4, x.numel()))]


def layer_steps(b: Builder, stack: nn.Module, p: str, layer: int, tokens: list[str], section: str, *,
                memory: tuple[str, list[str]] | None = None, compact_self: bool = False) -> None:
    """The block's steps in the order its norm_position computes them."""
    block = stack.blocks[layer]
    pre = f"{p}blocks.{layer}."
    position = block.norm_position
    self_mask = layer_mask(b, stack, layer, len(tokens))
    fi = b.row(len(tokens))

    def sublayer(name: str, sub_in: str) -> str:
        """Narrate sublayer `name` reading `sub_in`; return the point of its output."""
        if name == "mlp":
            ffn_steps(b, block.mlp, f"{pre}mlp.", sub_in, tokens, section)
        elif name == "cross_attn":
            attention_steps(b, block.cross_attn, f"{pre}cross_attn.", sub_in, memory[0], tokens, memory[1],
                            None, None, section, cross=True)
        elif compact_self:
            compact_attention_step(b, block.attn, f"{pre}attn.", sub_in, tokens, self_mask, section,
                                   position_bias(b, stack, len(tokens)))
        else:
            bias = position_bias(b, stack, len(tokens))
            attention_steps(b, block.attn, f"{pre}attn.", sub_in, sub_in, tokens, tokens, self_mask, bias,
                            section, cross=False)
        return f"{pre}{name}.out"

    if block.parallel:
        stream = f"{pre}resid_pre"
        norm_step(b, section, f"{norm_name(block.attn_norm)} before both sublayers", say("parallel"),
                  block.attn_norm, stream, f"{pre}attn_norm.out", tokens, "X̂")
        attn_out = sublayer("attn", f"{pre}attn_norm.out")
        mlp_in = f"{pre}attn_norm.out"
        if hasattr(block, "mlp_norm"):
            mlp_in = f"{pre}mlp_norm.out"
            norm_step(b, section, f"{norm_name(block.mlp_norm)} before the feed-forward network", say("parallel"),
                      block.mlp_norm, stream, mlp_in, tokens, "X̂'")
        mlp_out = sublayer("mlp", mlp_in)
        x, total = b.get(stream, 0), b.get(attn_out, 0) + b.get(mlp_out, 0)
        result = b.get(f"{pre}resid_post", 0)
        b.add(section, "Residual connection (parallel)", say("residual"),
              "X' = X + Attention(X̂) + FFN(X̂')", r"X' = X + \mathrm{Attention}(\hat X) + \mathrm{FFN}(\hat X')",
              [b.matrix("X'", "X'", f"{pre}resid_post", (0,), rows=tokens, highlight=fi)],
              b.check("X + Attention + FFN", f"the model's {pre}resid_post", x + total, result),
              residual_worked(b, x[fi], total[fi], result[fi], tokens[fi], f"the model's {pre}resid_post"))
        return

    stream = f"{pre}resid_pre"
    names = ["attn"] + (["cross_attn"] if block.has_cross_attention else []) + ["mlp"]
    outputs = {"attn": "resid_mid", "cross_attn": "resid_cross", "mlp": "resid_post"}
    for name in names:
        before = getattr(block, f"{name}_norm", None)
        after = getattr(block, f"{name}_out_norm", None)
        sub_in = stream
        if before is not None and position != "post":
            sub_in = f"{pre}{name}_norm.out"
            norm_step(b, section, f"{norm_name(before)} before the {SUBLAYER_WORDS[name]}", say("pre_norm"),
                      before, stream, sub_in, tokens, "X̂")
        update = sublayer(name, sub_in)
        what = SUBLAYER_NAMES[name]
        if after is not None:
            norm_step(b, section, f"{norm_name(after)} on the {SUBLAYER_WORDS[name]}'s output",
                      say("out_norm", how="sandwich norm, Gemma" if position == "sandwich" else "OLMo 2"),
                      after, update, f"{pre}{name}_out_norm.out", tokens, f"{what}'")
            update = f"{pre}{name}_out_norm.out"
        result_point = f"{pre}{outputs[name]}"
        x, y, result = b.get(stream, 0), b.get(update, 0), b.get(result_point, 0)
        if position == "post":
            n = norm_name(before)
            rule = ("LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β" if n == "LayerNorm"
                    else "RMSNorm(x) = x / √(mean(x²) + ε) · γ")
            shown = [Matrix(f"X + {what}", f"X + \\mathrm{{{what}}}", x + y, rows=tokens, highlight=fi),
                     b.matrix("X'", "X'", result_point, (0,), rows=tokens, highlight=fi)]
            if b.small:
                shown.append(b.param("γ", r"\gamma", before.weight, labels=["γ"]))
                if getattr(before, "bias", None) is not None:
                    shown.append(b.param("β", r"\beta", before.bias, labels=["β"]))
            b.add(section, f"Residual and {n}", say("post_norm", rule=rule, eps=before.eps),
                  f"X' = {n}(X + {what}(X))", f"X' = \\mathrm{{{n}}}(X + \\mathrm{{{what}}}(X))", shown,
                  b.check(f"{n}(X + {what}) from the module's {norm_parameters(before)}", f"the model's {result_point}",
                          norm(x + y, before), result),
                  residual_worked(b, x[fi], y[fi], (x + y)[fi], tokens[fi], f"X + {what}, as shown")
                  + norm_worked(b, (x + y)[fi], before, result[fi], tokens[fi], f"the model's {result_point}[0, {fi}]"))
        else:
            inner = f"Norm({what}(Norm(X)))" if position == "sandwich" else (
                f"Norm({what}(X))" if position == "post_sublayer" else f"{what}(Norm(X))")
            b.add(section, "Residual connection", say("residual"), f"X' = X + {inner}",
                  "X' = X + " + inner.replace("Norm", r"\mathrm{Norm}").replace(what, f"\\mathrm{{{what}}}"),
                  [b.matrix("X'", "X'", result_point, (0,), rows=tokens, highlight=fi)],
                  b.check(f"X + {what}", f"the model's {result_point}", x + y, result),
                  residual_worked(b, x[fi], y[fi], result[fi], tokens[fi], f"the model's {result_point}"))
        stream = result_point


def position_bias(b: Builder, stack: nn.Module, n: int) -> torch.Tensor | None:
    """The bias self-attention adds to its scores, [H, T, T]: ALiBi's, or T5's learned bias per
    bucket of key - query distance (the stack's own table, looked up for these positions)."""
    if b.config.pos_encoding == "alibi":
        return alibi(stack, n)
    if b.config.pos_encoding == "relative":
        position = torch.arange(n)
        return f64(stack.relative_position_bias(position, position))  # (H, T, T)
    return None


def alibi(stack: nn.Module, n: int) -> torch.Tensor:
    """The ALiBi bias −m_h |i − j| for every head: [H, T, T]."""
    slopes = f64(stack.alibi_slopes)  # (H,)
    position = torch.arange(n, dtype=torch.float64)
    return -slopes[:, None, None] * (position[:, None] - position[None, :]).abs()  # (H, T, T)


def ffn_steps(b: Builder, mlp: nn.Module, m: str, x_in: str, tokens, section: str) -> None:
    """The feed-forward network (or the mixture of experts) on every row, one neuron by hand."""
    if hasattr(mlp, "experts"):
        return moe_step(b, mlp, m, x_in, tokens, section)
    act, act_eq, act_name = activation(b.config.activation)
    x = b.get(x_in, 0)
    # Name what the model has: x̂ where a norm precedes, a bias only where there is one, and a gated
    # unit's three matrices by their roles (gate, up, down: SwiGLU, GeGLU).
    xin = "x̂" if x_in.endswith("norm.out") else "x"
    xin_latex = r"\hat x" if xin == "x̂" else "x"
    b1 = " + b_1" if mlp.fc_in.bias is not None else ""
    b2 = " + b_2" if mlp.fc_out.bias is not None else ""
    if mlp.gated:
        gate = linear(x, mlp.fc_gate)
        up = linear(x, mlp.fc_in)
        hidden_mine = act(gate) * up
        w_first, w_second = "W_gate", "W_down"
        hidden_name = f"{act_name}({xin}·W_gate) ⊙ {xin}·W_up"
        hidden_latex = r"\mathrm{" + act_name + "}(" + xin_latex + r" W_{gate}) \odot " + xin_latex + r" W_{up}"
        equation = f"FFN({xin}) = ({hidden_name})·W_down"
        latex = r"\mathrm{FFN}(" + xin_latex + r") = \left(" + hidden_latex + r"\right) W_{down}"
    else:
        gate = linear(x, mlp.fc_in)
        hidden_mine = act(gate)
        w_first, w_second = "W_1", "W_2"
        hidden_name = f"{act_name}({xin}·W_1{b1})"
        hidden_latex = r"\mathrm{" + act_name + "}(" + xin_latex + " W_1" + b1 + ")"
        equation = f"FFN({xin}) = {hidden_name}·W_2{b2},   {act_name}(x) = {act_eq}"
        latex = r"\mathrm{FFN}(" + xin_latex + ") = " + hidden_latex + r"\, W_2" + b2
        if b.config.activation == "relu":
            equation = f"FFN({xin}) = max(0, {xin}·W_1{b1})·W_2{b2}"
            latex = r"\mathrm{FFN}(" + xin_latex + r") = \max(0,\, " + xin_latex + " W_1" + b1 + r")\, W_2" + b2
    out_mine = linear(hidden_mine, mlp.fc_out)
    pre, hidden, out = b.get(f"{m}pre", 0), b.get(f"{m}post", 0), b.get(f"{m}out", 0)
    F, E = b.config.d_ff, b.config.d_model
    fi = b.row(len(tokens))
    n = int(hidden[fi].abs().argmax())  # the neuron most active on the highlighted row
    shown = [b.param(w_first, w_first, (mlp.fc_gate if mlp.gated else mlp.fc_in).weight)] if b.small else []
    if b.small and mlp.gated:
        shown.append(b.param("W_up", "W_up", mlp.fc_in.weight))
    shown.append(b.matrix(hidden_name, hidden_latex, f"{m}post", (0,), rows=tokens, highlight=fi))
    if b.small:
        shown.append(b.param(w_second, w_second, mlp.fc_out.weight))
    shown.append(b.matrix("FFN", r"\mathrm{FFN}", f"{m}out", (0,), rows=tokens, highlight=fi))
    weight_in = f64(mlp.fc_gate.weight if mlp.gated else mlp.fc_in.weight)[n]
    bias_in = mlp.fc_gate.bias if mlp.gated else mlp.fc_in.bias
    column_out = f64(mlp.fc_out.weight)[:, n]  # (E,): what neuron n writes per unit of activation
    contribution = hidden[fi, n] * column_out
    first = "gate" if mlp.gated else "pre-activation"
    worked = [
        b.worked(f"neuron {n}, row '{tokens[fi]}': {first} = {products(x[fi], weight_in)}"
                 + (f" {signed(float(f64(bias_in)[n]))}" if bias_in is not None else "") + f" = {fmt(float(gate[fi, n]))}",
                 f"h_{{{n}}} = {xin_latex} \\cdot {w_first}[:, {n}]" + (f" + b_{{1,{n}}}" if bias_in is not None else "")
                 + f" = {fmt(float(gate[fi, n]))}",
                 gate[fi, n], pre[fi, n], f"the model's {m}pre[0, {fi}, {n}]"),
        b.worked(f"activation {act_name}({fmt(float(gate[fi, n]))})"
                 + (f" × up {fmt(float(up[fi, n]))} (= {xin}·W_up[:, {n}])" if mlp.gated else "")
                 + f" = {fmt(float(hidden_mine[fi, n]))}",
                 f"\\mathrm{{{act_name}}}(h_{{{n}}})" + (f" \\cdot u_{{{n}}}" if mlp.gated else "")
                 + f" = {fmt(float(hidden_mine[fi, n]))}",
                 hidden_mine[fi, n], hidden[fi, n], f"the model's {m}post[0, {fi}, {n}]"),
        b.worked(f"its contribution to the output: {fmt(float(hidden[fi, n]))} × {w_second}[{n}, :] = {vec(contribution)}; "
                 f"the {F} neurons' contributions" + (" plus b_2" if mlp.fc_out.bias is not None else "")
                 + f" sum to FFN('{tokens[fi]}') = {vec(out[fi])}",
                 f"\\mathrm{{FFN}}({xin_latex}) = \\sum_n a_n {w_second}[n, :]" + b2,
                 (hidden[fi][:, None] * f64(mlp.fc_out.weight).T).sum(0)
                 + (f64(mlp.fc_out.bias) if mlp.fc_out.bias is not None else 0.0), out[fi], f"the model's {m}out[0, {fi}]"),
    ]
    b.add(
        section, "Feed-forward network", say("ffn_gated" if mlp.gated else "ffn", E=E, F=F, act=act_name),
        equation, latex, shown,
        b.check("both layers with the module's weights", f"the model's {m}post and {m}out",
                torch.cat([hidden_mine.flatten(), out_mine.flatten()]), torch.cat([hidden.flatten(), out.flatten()])),
        worked,
    )


def moe_step(b: Builder, moe: nn.Module, m: str, x_in: str, tokens, section: str) -> None:
    """The router's choice and the weighted sum of the chosen experts, recomputed for every token."""
    x = b.get(x_in, 0)
    act = activation(b.config.activation)[0]
    probs = softmax(linear(x, moe.router))  # (T, N)
    top_p, top = probs.topk(moe.top_k, dim=-1)
    weights = torch.zeros_like(probs).scatter(-1, top, top_p / top_p.sum(-1, keepdim=True))
    out = torch.zeros_like(x)
    for i, expert in enumerate(moe.experts):
        hidden = act(linear(x, expert.fc_gate)) * linear(x, expert.fc_in) if expert.gated else act(linear(x, expert.fc_in))
        out += weights[:, i:i + 1] * linear(hidden, expert.fc_out)
    n = len(moe.experts)
    b.add(
        section, "Mixture of experts", say("moe", n=n, k=moe.top_k),
        "MoE(x) = Σ_{i ∈ top-k} g_i(x) FFN_i(x),   g = softmax(x·W_router) renormalised over the top k",
        r"\mathrm{MoE}(x) = \sum_{i \in \text{top-}k} g_i(x)\, \mathrm{FFN}_i(x)",
        [b.matrix("g", "g", f"{m}expert_weights", (0,), rows=tokens, cols=[f"expert {i}" for i in range(n)]),
         b.matrix("MoE", r"\mathrm{MoE}", f"{m}out", (0,), rows=tokens)],
        b.check("the router and every chosen expert with the module's weights",
                f"the model's {m}expert_weights and {m}out",
                torch.cat([weights.flatten(), out.flatten()]),
                torch.cat([b.get(f"{m}expert_weights", 0).flatten(), b.get(f"{m}out", 0).flatten()])),
    )
