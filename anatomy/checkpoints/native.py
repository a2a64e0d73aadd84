"""anatomy's own checkpoint format, for models no Hugging Face architecture expresses.

    anatomy_config.json   the ModelConfig, as JSON
    model.safetensors     every parameter under its anatomy name (a tied matrix once)

The seed 004 toy (a post-norm decoder with sinusoids), a pre-norm encoder-decoder or a
mean-pooled classifier have no transformers class; they still save and load, through the same
checked engine as the four architectures, with an identity table.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..config import ConfigError, ModelConfig
from ..models import FAMILIES
from .engine import Rule, export, load_into
from .files import CheckpointError, Weights, read_json, write_safetensors

NATIVE_CONFIG = "anatomy_config.json"


def identity_table(model: nn.Module) -> list[Rule]:
    """One rule per parameter, under its own name; a tied matrix's other names are derived copies."""
    rules, seen = [], set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        rules.append(Rule(name, name, derived=id(parameter) in seen))
        seen.add(id(parameter))
    return rules


def save_native(model: nn.Module, directory: str | Path) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = export(model, identity_table(model))
    write_safetensors({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
    model.config.to_json(out / NATIVE_CONFIG)
    return out


def load_native(directory: Path) -> nn.Module:
    try:
        config = ModelConfig.from_dict(read_json(directory / NATIVE_CONFIG, "anatomy config"))
    except ConfigError as error:
        raise CheckpointError(f"{str(directory / NATIVE_CONFIG)!r} describes an invalid model: {error}") from None
    model = FAMILIES[config.arch](config)
    load_into(model, identity_table(model), Weights(directory), (), "anatomy")
    return model
