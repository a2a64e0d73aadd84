"""Writing a model: Hugging Face format where an architecture expresses it, anatomy's own otherwise."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..models import register_saver

from .files import CheckpointError
from .writing import parse_size, staged_folder
from .hf import architecture_of, save_folder
from .native import save_native

SAVE_FORMATS = ("auto", "hf", "anatomy")


def save_pretrained(model: nn.Module, directory: str | Path, format: str = "auto",
                    max_shard_size: int | str = "5GB") -> Path:
    """Write `model` to `directory`; from_pretrained(directory) gives it back, in the model's dtype.

    format "hf": a Hugging Face checkpoint, config.json (with model_type and architectures) and
    model.safetensors, that transformers loads and computes the same outputs with; raises
    CheckpointError, with each architecture's reason, when none of them expresses the config.
    format "anatomy": anatomy_config.json + model.safetensors (anatomy's own names).
    format "auto" (default): "hf" when an architecture expresses the config, else "anatomy".
    max_shard_size: weights beyond it are split into model-0000k-of-0000n.safetensors files and
    model.safetensors.index.json (bytes, or "5GB", "500MB"), as transformers writes them.
    A tokenizer attached as `model.tokenizer` is saved beside the weights.
    Everything is written into a hidden folder beside `directory` and moved in at the end
    (writing.staged_folder): a save that is interrupted, even by kill -9, leaves no file in `directory`,
    and the config and weights of an earlier save there are replaced together.
    """
    if format not in SAVE_FORMATS:
        raise ValueError(f"format={format!r} is not supported; allowed values: {', '.join(map(repr, SAVE_FORMATS))}")
    parse_size(max_shard_size)  # a bad size is refused before anything is written
    out = Path(directory)
    arch = None
    if format != "anatomy":
        try:
            arch, class_name = architecture_of(model.config)
        except CheckpointError:
            if format == "hf":
                raise
    with staged_folder(out) as staging:  # an interrupted save leaves nothing in `out`
        if arch is None:
            save_native(model, staging, max_shard_size)
        else:
            save_folder(model, staging, arch, class_name, max_shard_size)
        if getattr(model, "tokenizer", None) is not None:
            model.tokenizer.save(staging)
    return out


register_saver(save_pretrained)  # the writer behind model.save_pretrained
