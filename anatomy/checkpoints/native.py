"""anatomy's own checkpoint format, for models no Hugging Face architecture expresses.

    anatomy_config.json   the ModelConfig, as JSON
    model.safetensors     every parameter under its anatomy name (a tied matrix once)

The article's toy (a post-norm decoder with sinusoids), a pre-norm encoder-decoder or a
mean-pooled classifier have no transformers class; they still save and load, through the same
checked engine as the four architectures, with an identity table.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from ..config import ConfigError, ModelConfig
from .engine import Rule, check_fit, export, load_into
from .files import CheckpointError, Weights, check_finite, read_json, shorten
from .writing import write_safetensors
from .memory import check_claimed_sizes, check_config_sizes, check_memory, check_weights_memory, empty_model

NATIVE_CONFIG = "anatomy_config.json"
LAYER_NAME = re.compile(r"(encoder\.|decoder\.|)blocks\.([0-9]{1,18})\.")


def identity_table(model: nn.Module) -> list[Rule]:
    """One rule per parameter, under its own name; a tied matrix's other names are derived copies."""
    rules, seen = [], set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        rules.append(Rule(name, name, derived=id(parameter) in seen))
        seen.add(id(parameter))
    return rules


def save_native(model: nn.Module, directory: str | Path, max_shard_size: int | str = "5GB") -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(export(model, identity_table(model)), out, max_shard_size)
    model.config.to_json(out / NATIVE_CONFIG)
    return out


# anatomy_config.json's sizes, bounded by the weight headers before a ModelConfig exists (its
# __post_init__ makes a tuple of n_layers layer types): counts of layers and experts, and widths.
COUNT_FIELDS = ("n_layers", "decoder_n_layers", "n_experts")
WIDTH_FIELDS = ("vocab_size", "d_model", "d_embed", "d_ff", "decoder_d_ff", "n_heads", "decoder_n_heads",
                "n_kv_heads", "d_head", "type_vocab_size")


def native_config(directory: Path, attn_impl: str | None = None, *, root: Path | None = None,
                  weights: Weights | None = None) -> ModelConfig:
    """The ModelConfig in `directory`'s anatomy_config.json, its sizes bounded by the weights' headers
    (opened here unless given; `root` as for Weights). CheckpointError naming the file if invalid."""
    path = directory / NATIVE_CONFIG
    what = repr(shorten(str(path)))
    data = read_json(path, "anatomy config")
    weights = weights if weights is not None else Weights(directory, root=root)
    check_finite(data, what)
    check_claimed_sizes(data, COUNT_FIELDS, WIDTH_FIELDS, weights, what,
                        at_least={"n_experts": 0, "type_vocab_size": 0})
    try:
        config = ModelConfig.from_dict(data)
        config = config if attn_impl is None else config.replace(attn_impl=attn_impl)
    except (ConfigError, TypeError, ValueError, KeyError, ArithmeticError) as error:
        raise CheckpointError(f"{what} describes an invalid model: {shorten(str(error), 300)}") from None
    check_config_sizes(config, weights, str(path))
    return config


def load_native(directory: Path, *, dtype: torch.dtype | None = None, device=None, attn_impl: str | None = None,
                root: Path | None = None) -> nn.Module:
    """anatomy_config.json + weights -> the model, with the same checks and memory path as HF folders."""
    path = directory / NATIVE_CONFIG
    weights = Weights(directory, root=root)
    config = native_config(directory, attn_impl, weights=weights)
    dtype = dtype or next((weights.dtype(k) for k in weights if weights.dtype(k).is_floating_point), torch.float32)
    source = str(path)
    _check_depth(config, weights, source)
    check_memory(config, source)
    check_weights_memory(weights, list(weights), dtype, device, source)
    model = empty_model(config, source)
    check_fit(model, identity_table(model), weights, (), "anatomy")
    check_memory(config, source, model, dtype, device)
    load_into(model, identity_table(model), weights, (), "anatomy", dtype=dtype, device=device)
    return model.to(device=device, dtype=dtype).eval()


def _check_depth(config: ModelConfig, weights: Weights, source: str) -> None:
    """The config's layer counts against the tensor names (blocks.N., encoder./decoder.blocks.N.),
    before anything is built."""
    found: dict[str, int] = {}
    for name in weights:
        match = LAYER_NAME.match(name)
        if match:
            found[match.group(1)] = max(found.get(match.group(1), 0), int(match.group(2)) + 1)
    expected = {"": config.n_layers, "encoder.": config.n_layers,
                "decoder.": config.decoder_n_layers or config.n_layers}
    wrong = [f"{stack or 'the stack'}: the config says {expected[stack]} layers, the weights hold {n}"
             for stack, n in found.items() if n != expected[stack]]
    if wrong:
        raise CheckpointError(f"{source}: the config's depth does not match the weights ({'; '.join(wrong)})")
