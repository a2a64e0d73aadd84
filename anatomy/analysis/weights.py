"""Weight processing: the same function, with weights that are easier to read (TransformerLens's
`fold_ln`, `center_writing_weights`, `center_unembed`; Elhage et al. 2021, appendix).

Shape letters: E model width, V vocabulary, O a linear layer's output width.

Folding a norm's gain and bias into the linear layers that read it. A norm computes
n(x) * g + b (n: centre and scale, or scale alone for RMSNorm), and a reader W y + c; so

    W (n(x) * g + b) + c  =  (W diag(g)) n(x) + (W b + c)          W' = W diag(g),  c' = W b + c

after which the norm keeps only n (g = 1, b = 0). Valid where every reader of the norm is linear:
pre-norm blocks.

Centring the writing weights. Every reader of a pre-norm LayerNorm model's residual stream is a
LayerNorm, which subtracts the mean over E first; so the mean over E of whatever is written into
the stream changes nothing, and each writer (embeddings, W^O, W_out, their biases) can have it
removed: W <- W - mean_E(W). RMSNorm does not subtract the mean: not valid there.

Centring the unembedding. Adding the same constant to every logit of a position leaves the
softmax unchanged: W_U <- W_U - mean_V(W_U), b_U <- b_U - mean_V(b_U).

The returned model is a new one (tie_embeddings off, biases added where folding needs them); its
log-probs equal the original's within float error, which `check_processed` measures.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import LayerNorm, RMSNorm
from ..models import build_model


def _gain_and_bias(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(norm, LayerNorm):
        return norm.weight, norm.bias
    if isinstance(norm, RMSNorm):
        return (1.0 + norm.weight if norm.plus_one else norm.weight), None
    raise ValueError(f"no folding for the norm {type(norm).__name__}")


def fold_norm(norm: nn.Module, readers: list[nn.Linear]) -> None:
    """W' = W diag(g), c' = W b + c for every reader; then the norm's gain is 1 and its bias 0."""
    gain, bias = _gain_and_bias(norm)
    gain, bias = gain.detach().clone(), None if bias is None else bias.detach().clone()
    for linear in readers:
        if bias is not None:
            linear.bias.add_(linear.weight @ bias)  # W b + c (before W is rescaled)
        linear.weight.mul_(gain[None, :])  # W diag(g): (O, E) * (1, E)
    norm.weight.fill_(0.0 if getattr(norm, "plus_one", False) else 1.0)
    if bias is not None:
        norm.bias.zero_()


def _centre_writer(linear_or_embedding: nn.Module, over_rows: bool) -> None:
    """Remove the mean over E of what this module writes into the stream."""
    weight = linear_or_embedding.weight
    if over_rows:  # an embedding table [N, E]: each row is a written vector
        weight.sub_(weight.mean(dim=1, keepdim=True))
    else:  # a linear layer writing E outputs: [E, in]
        weight.sub_(weight.mean(dim=0, keepdim=True))
        if linear_or_embedding.bias is not None:
            linear_or_embedding.bias.sub_(linear_or_embedding.bias.mean())


def _stacks(model: nn.Module) -> list[nn.Module]:
    return [model.encoder, model.decoder] if model.config.arch == "encoder-decoder" else [model]


def _check(model: nn.Module, fold_layernorm: bool, centre: bool, center_unembed: bool) -> None:
    config = model.config
    if config.norm_position != "pre" and (fold_layernorm or centre):
        raise ValueError(f"folding norms and centring the stream need pre-norm blocks (norm_position='pre'); this "
                         f"model has norm_position={config.norm_position!r}, where norms sit on the stream itself")
    if getattr(config, "n_experts", 0) and fold_layernorm:
        raise ValueError("folding the MLP norm into a mixture of experts is not supported; pass fold_layernorm=False")
    if centre and config.norm != "layernorm":
        raise ValueError(f"centring the writing weights needs LayerNorm (it removes the mean); this model uses "
                         f"norm={config.norm!r}: pass center_writing_weights=False")
    if centre and not config.final_norm:
        raise ValueError("centring the writing weights needs a final norm: without one the LM head reads the raw stream")
    if center_unembed and getattr(config, "final_logit_softcap", None) is not None:
        raise ValueError("centring the unembedding changes soft-capped logits; pass center_unembed=False")


def process_weights(
    model: nn.Module,
    *,
    fold_layernorm: bool = True,
    center_writing_weights: bool | None = None,
    center_unembed: bool = True,
) -> nn.Module:
    """A new model computing the same log-probs with processed weights (see the module docstring).

    center_writing_weights=None: where valid (LayerNorm models). Raises ValueError, before
    building anything, for a model where a requested step would change the output."""
    config = model.config
    centre = config.norm == "layernorm" if center_writing_weights is None else center_writing_weights
    center_unembed = center_unembed and hasattr(model, "lm_head")
    _check(model, fold_layernorm, centre, center_unembed)
    has_norm_bias = config.norm == "layernorm"
    new_config = config.replace(
        tie_embeddings=False,
        attn_bias=config.attn_bias or (fold_layernorm and has_norm_bias),
        mlp_bias=config.mlp_bias or (fold_layernorm and has_norm_bias),
        lm_head_bias=config.lm_head_bias or (fold_layernorm and has_norm_bias and not config.lm_head_transform),
    )
    new = build_model(new_config).eval()
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not name.endswith("bias") for name in missing):
        raise RuntimeError(f"processed model does not take the weights: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name in missing:  # the biases folding needs start at zero
            new.get_parameter(name).zero_()
        if fold_layernorm:
            _fold_all(new)
        if centre:
            _centre_all(new)
        if center_unembed:
            proj = new.lm_head.proj
            proj.weight.sub_(proj.weight.mean(dim=0, keepdim=True))  # mean over V, per column
            if proj.bias is not None:
                proj.bias.sub_(proj.bias.mean())
    new.tokenizer = getattr(model, "tokenizer", None)
    return new


def _fold_all(model: nn.Module) -> None:
    config = model.config
    for stack in _stacks(model):
        for block in stack.blocks:
            attn = block.attn
            readers = [attn.q_proj, attn.k_proj, attn.v_proj]
            mlp_readers = [block.mlp.fc_in] + ([block.mlp.fc_gate] if block.mlp.gated else [])
            if getattr(block, "mlp_norm", None) is None:  # GPT-J: the two branches share attn_norm
                readers += mlp_readers
            else:
                fold_norm(block.mlp_norm, mlp_readers)
            fold_norm(block.attn_norm, readers)
            if block.has_cross_attention:
                fold_norm(block.cross_attn_norm, [block.cross_attn.q_proj])
    if config.arch == "encoder-decoder" and hasattr(model.encoder, "final_norm"):
        # The encoder's output (memory) is read by every cross-attention's keys and values.
        fold_norm(model.encoder.final_norm, [r for b in model.decoder.blocks for r in (b.cross_attn.k_proj, b.cross_attn.v_proj)])
    top = model.decoder if config.arch == "encoder-decoder" else model
    if hasattr(top, "final_norm") and hasattr(model, "lm_head") and config.head in ("lm", "masked-lm"):
        head = model.lm_head
        fold_norm(top.final_norm, [head.transform_dense if hasattr(head, "transform_dense") else head.proj])


def _centre_all(model: nn.Module) -> None:
    for stack in _stacks(model):
        _centre_writer(stack.token_embedding, over_rows=True)
        for name in ("position_embedding", "token_type_embedding"):
            module = getattr(stack, name, None)
            if isinstance(module, nn.Embedding):  # sinusoids are a fixed table, not a weight
                _centre_writer(module, over_rows=True)
        for block in stack.blocks:
            _centre_writer(block.attn.o_proj, over_rows=False)
            if block.has_cross_attention:
                _centre_writer(block.cross_attn.o_proj, over_rows=False)
            _centre_writer(block.mlp.fc_out, over_rows=False)
