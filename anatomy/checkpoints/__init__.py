"""Real checkpoints: load and save Hugging Face-format BERT, GPT-2, Marian and Llama.

    model = anatomy.from_pretrained("path/to/dir")        # or "minilm"
    tokenizer = anatomy.load_tokenizer("path/to/dir")
    anatomy.save_pretrained(model, "out/")                # transformers can load it back

Each architecture is a file of data (bert.py, gpt2.py, marian.py, llama.py): a function from the
Hugging Face config to a ModelConfig, and a table of weight names, splits and transposes. The
engine (engine.py) applies any table in both directions. Every problem is a CheckpointError,
raised before a model is returned.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from ..config import SPECIAL_TOKEN_FIELDS, ConfigError, ModelConfig
from ..models import FAMILIES, register_saver
from . import bert, gpt2, llama, marian
from . import gemma, gemma2, gpt_neox, mistral, qwen2, qwen3  # the rotary decoder families
from . import bart, distilbert, opt, roberta  # learned positions
from .engine import Architecture, Rule, expand, export, load_into
from .files import CheckpointError, Weights, read_json, resolve, write_safetensors
from .native import NATIVE_CONFIG, load_native, save_native
from .sentence import sentence_embeddings, sentence_transformers_config
from .tokenizer import Tokenizer

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    bert.ARCHITECTURE, gpt2.ARCHITECTURE, marian.ARCHITECTURE, llama.ARCHITECTURE,
    mistral.ARCHITECTURE,
    roberta.ARCHITECTURE, distilbert.ARCHITECTURE, bart.ARCHITECTURE, opt.ARCHITECTURE,
    qwen2.ARCHITECTURE,
    qwen3.ARCHITECTURE,
    gpt_neox.ARCHITECTURE,
    gemma.ARCHITECTURE,
    gemma2.ARCHITECTURE,
)}

__all__ = [
    "ARCHITECTURES", "CheckpointError", "Tokenizer", "from_pretrained", "load_tokenizer", "save_pretrained",
    "sentence_embeddings", "read_config", "architecture_of",
]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint folder (or "minilm"), as anatomy's one Tokenizer type."""
    return Tokenizer.load(resolve(path))


def read_config(path: str | Path) -> tuple[dict, Architecture, str]:
    """config.json of a checkpoint -> (the HF config dict, its Architecture, its HF class name)."""
    directory = resolve(path)
    hf = read_json(directory / "config.json", "config file")
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"model_type={model_type!r} in {str(directory / 'config.json')!r} is not supported; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    arch = ARCHITECTURES[model_type]
    names = hf.get("architectures") or [next(iter(arch.classes))]
    known = [n for n in names if n in arch.classes]
    if not known:
        raise CheckpointError(
            f"architectures={names} in config.json: anatomy implements {', '.join(arch.classes)} for {model_type}"
        )
    return hf, arch, known[0]


def _rules(arch: Architecture, config: ModelConfig, prefixed: bool) -> list[Rule]:
    """The table for this config, with "{i}" expanded and the base prefix kept or dropped."""
    rules = expand(arch.table(config), config.n_layers, config.decoder_n_layers)
    if prefixed:
        return rules
    start = arch.base_prefix + "."
    return [dataclasses.replace(r, hf=r.hf[len(start):]) if r.hf.startswith(start) else r for r in rules]


def from_pretrained(path: str | Path, *, dtype: torch.dtype = torch.float32, attn_impl: str | None = None) -> nn.Module:
    """Build the anatomy model a Hugging Face-format directory describes and load its weights.

    path: a directory with config.json and model.safetensors (or pytorch_model.bin, or a sharded
    *.index.json), or anatomy's own anatomy_config.json + model.safetensors, or "minilm".
    Returns the model in eval mode, in `dtype`.
    Raises CheckpointError for a missing directory or file, an unsupported model_type, a
    missing/unexpected/mis-shaped/non-finite tensor (each named) or a corrupt weights file.
    """
    directory = resolve(path)
    if not (directory / "config.json").is_file() and (directory / NATIVE_CONFIG).is_file():
        return load_native(directory).to(dtype).eval()
    hf, arch, class_name = read_config(directory)
    weights = Weights(directory)
    keys = set(weights)
    try:
        config = arch.to_config(hf, class_name, keys)
        config = config.replace(**_special_ids(hf, config.vocab_size, exclude=config.to_dict()))
        if attn_impl is not None:
            config = config.replace(attn_impl=attn_impl)
    except ConfigError as error:
        raise CheckpointError(f"config.json of {str(directory)!r} describes an invalid model: {error}") from None
    extra = {"hf_config": hf, "hf_class": class_name, "source": str(directory)}
    st = sentence_transformers_config(directory)
    if st:
        extra["sentence_transformers"] = st
    config.extra.update(extra)
    model = FAMILIES[config.arch](config)
    prefixed = any(k.startswith(arch.base_prefix + ".") for k in keys)
    load_into(model, _rules(arch, config, prefixed), weights, arch.ignore, arch.model_type)
    return model.to(dtype).eval()


def _special_ids(hf: dict, vocab_size: int, exclude: dict) -> dict:
    """bos/eos/decoder-start ids from config.json, where they name a real token and the
    architecture's own reader has not set them."""
    return {name: hf[name] for name in SPECIAL_TOKEN_FIELDS
            if exclude.get(name) is None and isinstance(hf.get(name), int) and 0 <= hf[name] < vocab_size}


def architecture_of(config: ModelConfig) -> tuple[Architecture, str]:
    """The HF architecture and class that can express `config` (the one it was loaded from, if any)."""
    source = config.extra.get("hf_config", {}).get("model_type")
    candidates = [ARCHITECTURES[source]] if source in ARCHITECTURES else list(ARCHITECTURES.values())
    reasons = []
    for arch in candidates:
        try:
            class_name = arch.class_for(config)
            arch.to_hf_config(config, class_name)
            return arch, class_name
        except CheckpointError as error:
            reasons.append(f"{arch.model_type}: {error}")
    raise CheckpointError("no Hugging Face architecture expresses this config:\n  " + "\n  ".join(reasons))


SAVE_FORMATS = ("auto", "hf", "anatomy")


def save_pretrained(model: nn.Module, directory: str | Path, format: str = "auto") -> Path:
    """Write `model` to `directory`; from_pretrained(directory) gives it back.

    format "hf": a Hugging Face checkpoint, config.json (with model_type and architectures) and
    model.safetensors, that transformers loads and computes the same outputs with; raises
    CheckpointError, with each architecture's reason, when none of them expresses the config.
    format "anatomy": anatomy_config.json + model.safetensors (anatomy's own names).
    format "auto" (default): "hf" when an architecture expresses the config, else "anatomy".
    """
    if format not in SAVE_FORMATS:
        raise ValueError(f"format={format!r} is not supported; allowed values: {', '.join(map(repr, SAVE_FORMATS))}")
    config: ModelConfig = model.config
    if format == "anatomy":
        return save_native(model, directory)
    try:
        arch, class_name = architecture_of(config)
    except CheckpointError:
        if format == "hf":
            raise
        return save_native(model, directory)
    hf = dict(config.extra.get("hf_config", {})) if config.extra.get("hf_config", {}).get("model_type") == arch.model_type else {}
    hf.update(arch.to_hf_config(config, class_name))
    hf.update({name: getattr(config, name) for name in SPECIAL_TOKEN_FIELDS if getattr(config, name) is not None})
    hf.update(model_type=arch.model_type, architectures=[class_name])
    hf.pop("transformers_version", None)
    tensors = export(model, _rules(arch, config, prefixed=class_name not in arch.base_classes))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    write_safetensors({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, out / "model.safetensors")
    return out


register_saver(save_pretrained)

