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
from .files import CheckpointError, Weights, read_json, write_safetensors
from .memory import check_memory, empty_model

NATIVE_CONFIG = "anatomy_config.json"
LAYER_NAME = re.compile(r"(encoder\.|decoder\.|)blocks\.(\d+)\.")


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


def native_config(directory: Path, attn_impl: str | None = None) -> ModelConfig:
    """The ModelConfig in `directory`'s anatomy_config.json; CheckpointError naming the file if invalid."""
    path = directory / NATIVE_CONFIG
    try:
        config = ModelConfig.from_dict(read_json(path, "anatomy config"))
        return config if attn_impl is None else config.replace(attn_impl=attn_impl)
    except (ConfigError, TypeError, ValueError, KeyError) as error:
        raise CheckpointError(f"{str(path)!r} describes an invalid model: {error}") from None


def load_native(directory: Path, *, dtype: torch.dtype | None = None, device=None, attn_impl: str | None = None,
                root: Path | None = None) -> nn.Module:
    """anatomy_config.json + weights -> the model, with the same checks and memory path as HF folders."""
    path = directory / NATIVE_CONFIG
    config = native_config(directory, attn_impl)
    weights = Weights(directory, root=root)
    dtype = dtype or next((weights.dtype(k) for k in weights if weights.dtype(k).is_floating_point), torch.float32)
    source = str(path)
    _check_depth(config, weights, source)
    check_memory(config, source)
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
