"""Hugging Face-format folders <-> anatomy models, through the architecture tables.

    config.json                     model_type, architectures, sizes, flags
    model.safetensors               the weights (or shards + model.safetensors.index.json,
                                    or pytorch_model.bin, read with weights_only=True)

`model_from_hf` is the one path from an HF config dict and a `Weights` source to a loaded model:
folders, Hub snapshots and GGUF files (whose metadata becomes an HF config dict) all go through it,
and with it through the same checks: sizes against the weight headers and the machine's memory
before anything is allocated (memory.py), then every tensor by name (engine.py).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import torch
from torch import nn

from ..config import SPECIAL_TOKEN_FIELDS, ConfigError, ModelConfig
from .config_keys import ReadKeys, leave_out_unknown_keys, warn_unknown_keys
from .engine import Architecture, Rule, check_fit, expand, export, load_into
from .files import CheckpointError, Weights, check_finite, read_json, shorten
from .writing import write_safetensors
from .memory import (
    check_claimed_sizes, check_config_sizes, check_layers, check_memory, check_weights_memory, empty_model,
)
from .registry import ARCHITECTURES
from .sentence import sentence_transformers_config

CONFIG_FILE = "config.json"
# config.json's "dtype" (transformers >= 4.56; "torch_dtype" before, still read by 4.56 to 5.x) -> the torch dtype
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def architecture_for(hf: dict, where: str) -> tuple[Architecture, str]:
    """(Architecture, HF class name) of an HF config dict; `where` names its file in errors."""
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"model_type={shorten(repr(model_type), 80)} in {shorten(where)} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    arch = ARCHITECTURES[model_type]
    names = hf.get("architectures") or [next(iter(arch.classes))]
    known = [n for n in names if isinstance(n, str) and n in arch.classes] if isinstance(names, list) else []
    if not known:
        raise CheckpointError(f"architectures={shorten(repr(names), 120)} in {shorten(where)}: anatomy implements "
                              f"{', '.join(arch.classes)} for {model_type}")
    return arch, known[0]


def read_config(directory: Path) -> tuple[dict, Architecture, str]:
    """config.json of a checkpoint folder -> (the HF config dict, its Architecture, its HF class name)."""
    hf = read_json(directory / CONFIG_FILE, "config file")
    return (hf, *architecture_for(hf, repr(str(directory / CONFIG_FILE))))


def rules_for(arch: Architecture, config: ModelConfig, prefixed: bool, *, per_layer: bool = True) -> list[Rule]:
    """The table for this config, the base prefix kept or dropped, "{i}"/"{j}" expanded per layer
    (or left as patterns: per_layer=False)."""
    rules = arch.table(config)
    if not prefixed:
        start = arch.base_prefix + "."
        rules = [dataclasses.replace(r, hf=r.hf[len(start):]) if r.hf.startswith(start) else r for r in rules]
    return expand(rules, config.n_layers, config.decoder_n_layers) if per_layer else rules


def special_ids(hf: dict, vocab_size: int, exclude: dict) -> dict:
    """bos/eos/decoder-start ids from config.json, where they name a real token and the
    architecture's own reader has not set them."""
    return {name: hf[name] for name in SPECIAL_TOKEN_FIELDS
            if exclude.get(name) is None and type(hf.get(name)) is int and 0 <= hf[name] < vocab_size}


def stored_dtype(hf: dict, weights: Weights) -> torch.dtype:
    """What dtype=None means, as in transformers: config.json's dtype, else the first floating
    tensor's, else float32."""
    named = hf.get("dtype", hf.get("torch_dtype"))
    if named in DTYPES:
        return DTYPES[named]
    for name in weights:
        if weights.dtype(name).is_floating_point:
            return weights.dtype(name)
    return torch.float32


# The fields a config.json gives sizes in, across the architectures anatomy reads: counts of layers
# and experts (each holds at least one tensor), and widths (each the length of some tensor's axis).
LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
                      "num_decoder_layers")
COUNT_FIELDS = LAYER_COUNT_FIELDS + ("num_local_experts", "num_experts_per_tok")
WIDTH_FIELDS = (
    "hidden_size", "n_embd", "d_model", "dim", "word_embed_proj_dim",  # the model width
    "intermediate_size", "n_inner", "ffn_dim", "hidden_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
    "num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
    "num_key_value_heads", "head_dim", "d_kv", "rotary_dim",
    "vocab_size", "decoder_vocab_size", "type_vocab_size", "relative_attention_num_buckets", "num_labels",
)
# position counts: integers, bounded later by the memory their tables take (rotary, sinusoids)
POSITION_FIELDS = ("max_position_embeddings", "n_positions")


def check_layer_count_fields(hf: dict, names: set[str], source: str) -> None:
    """Before any config is built (a config makes per-layer tables): no layer count in config.json
    may exceed what the weights' names number, the largest index in a name plus one. A config
    claiming a billion layers is refused here, in the time it takes to read the names."""
    indices = [int(part) for name in names for part in name.split(".") if part.isascii() and part.isdigit()
               and len(part) < 19]  # a longer run of digits is no layer index (and int() would refuse 4300 digits)
    most = max(indices, default=-1) + 1
    for field in LAYER_COUNT_FIELDS:
        value = hf.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            raise CheckpointError(f"{source!r} does not fit its config: {field} — the config says {value}, "
                                  f"the weights hold {most} at most (the largest layer index in their names, plus one)")


def config_from_hf(hf: dict, weights, attn_impl: str | None = None) -> tuple[ModelConfig, Architecture, str]:
    """(ModelConfig, Architecture, HF class name) of an HF config dict and its weights, whose names
    and shapes come from the headers (no tensor is loaded).

    Every size is bounded before anything is built from it: numbers finite, layer and expert
    counts within the number of tensors, widths within the longest axis (memory.check_claimed_sizes),
    then the built config's sizes again (memory.check_config_sizes). Raises CheckpointError naming
    the weights' source for a config anatomy cannot build or sizes the weights do not back; warns
    (config_keys.UnknownConfigKeysWarning) naming the keys it neither reads nor knows to be harmless."""
    source = weights.source
    keys = set(weights)
    arch, class_name = architecture_for(hf, repr(source))
    what = f"the config of {shorten(source)!r}"
    check_finite(hf, what)
    check_layer_count_fields(hf, keys, source)
    check_claimed_sizes(hf, COUNT_FIELDS, WIDTH_FIELDS, weights, what, at_least={"type_vocab_size": 0})
    for name in POSITION_FIELDS:
        if hf.get(name) is not None and (type(hf[name]) is not int or hf[name] < 1):
            raise CheckpointError(f"{what} gives {name}={shorten(repr(hf[name]), 40)}; it must be an integer >= 1")
    recorded = ReadKeys(hf)  # which keys the reader looks at: the others are named in a warning
    try:
        config = arch.to_config(recorded, class_name, keys)
        config = config.replace(**special_ids(recorded, config.vocab_size, exclude=config.to_dict()))
        if attn_impl is not None:
            config = config.replace(attn_impl=attn_impl)
    except (ConfigError, TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as error:
        raise CheckpointError(f"{what} describes a model anatomy cannot build: {shorten(str(error), 300)}") from None
    check_config_sizes(config, weights, source)
    config.extra["hf_unknown_keys"] = warn_unknown_keys(recorded, arch.model_type, repr(shorten(source)))
    return config, arch, class_name


def model_from_hf(hf: dict, weights: Weights, *, dtype: torch.dtype | None = None, device=None,
                  attn_impl: str | None = None, extra: dict | None = None) -> nn.Module:
    """The anatomy model an HF config dict describes, loaded from `weights`, in eval mode.

    dtype: None keeps the checkpoint's (stored_dtype); device: where the weights go (default cpu).
    Raises CheckpointError, before allocating, for a config anatomy cannot build, layer counts or
    sizes that differ from the weight headers, a model larger than the memory available; then for
    any tensor that is missing, unexpected, mis-shaped, non-finite or inconsistent.
    """
    source = weights.source
    keys = set(weights)
    config, arch, class_name = config_from_hf(hf, weights, attn_impl)
    config.extra.update({"hf_config": hf, "hf_class": class_name, "source": source, **(extra or {})})
    dtype = dtype or stored_dtype(hf, weights)
    prefixed = any(k.startswith(arch.base_prefix + ".") for k in keys)
    expected = {"i": config.n_layers, "j": config.decoder_n_layers or config.n_layers}
    check_layers(rules_for(arch, config, prefixed, per_layer=False), keys, expected, source)
    check_memory(config, source)
    rules = rules_for(arch, config, prefixed)
    check_weights_memory(weights, [rule.hf for rule in rules if not rule.derived], dtype, device, source)
    model = empty_model(config, source)
    check_fit(model, rules, weights, arch.ignore, arch.model_type)
    check_memory(config, source, model, dtype, device)
    load_into(model, rules, weights, arch.ignore, arch.model_type, dtype=dtype, device=device)
    return model.to(device=device, dtype=dtype).eval()


def load_folder(directory: Path, *, root: Path | None = None, **options) -> nn.Module:
    """A Hugging Face-format folder -> model (options as model_from_hf). `root`: the folder that
    shard files (symlinks resolved) must stay inside, default `directory` itself."""
    hf, _, _ = read_config(directory)
    extra = {"source": str(directory)}
    st = sentence_transformers_config(directory)
    if st:
        extra["sentence_transformers"] = st
    return model_from_hf(hf, Weights(directory, root=root), extra=extra, **options)


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


def save_folder(model: nn.Module, directory: Path, arch: Architecture, class_name: str, max_shard_size: int | str) -> Path:
    """config.json + the weights (one file, or shards and an index beyond max_shard_size).

    config.json holds each setting in every spelling transformers 4.57 and 5 read (rope.py), so that
    both compute the same model. Where an architecture's writer finds that they cannot, it names the
    first version that reads the config as anatomy does (transformers_version), and a warning says so."""
    config: ModelConfig = model.config
    hf = dict(config.extra.get("hf_config", {})) if config.extra.get("hf_config", {}).get("model_type") == arch.model_type else {}
    hf = leave_out_unknown_keys(hf, config.extra.get("hf_unknown_keys", []))
    hf.pop("transformers_version", None)
    hf.update(arch.to_hf_config(config, class_name))
    if "transformers_version" in hf:
        warnings.warn(f"save_pretrained: transformers before {hf['transformers_version']} reads this {arch.model_type} "
                      "config as another model; config.json names the version it needs (transformers_version)",
                      stacklevel=4)
    hf.update({name: getattr(config, name) for name in SPECIAL_TOKEN_FIELDS if getattr(config, name) is not None})
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # null, or each version's class invents its own
        hf.setdefault(name, None)
    tensors = export(model, rules_for(arch, config, prefixed=class_name not in arch.base_classes))
    floating = [t.dtype for t in tensors.values() if t.is_floating_point()]
    hf.update(model_type=arch.model_type, architectures=[class_name])
    hf.pop("torch_dtype", None)
    if floating:  # both spellings: transformers before 4.56 reads only torch_dtype
        hf["dtype"] = hf["torch_dtype"] = str(floating[0]).removeprefix("torch.")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    write_safetensors(tensors, directory, max_shard_size)
    return directory
