"""What a model is, without loading it: the ModelConfig a name or a path resolves to, read from
config.json, a GGUF file's metadata, anatomy_config.json or the built-in table, never a tensor.

    config_of("smollm2").n_layers        # 30, from the GGUF metadata (llama.block_count)
    config_of("toy").arch                # "decoder", from the built-in table
    config_of("smolm2")                  # CheckpointError: ... did you mean 'smollm2'?

The command line asks it before any weight loads, so that a layer past the model's, an analysis
the model cannot run or a misspelt name is refused in the time it takes to read a header. The
names come from the same headers the loader checks (safetensors, GGUF tensor infos), and a GGUF
file's parsed metadata is kept for the load that follows (gguf.read_gguf).
"""

from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .files import Weights
from .gguf import open_gguf
from .hf import CONFIG_FILE, config_from_hf, read_config
from .hub import cache_dir, is_hub_id
from .native import native_config
from .resolver import PACKAGES, _local, cached, check_spelling, locate, path_exists
from .toys import TOY_MODELS, toy_config


def config_of(name_or_path: str | Path, revision: str | None = None) -> ModelConfig | None:
    """The ModelConfig that `from_pretrained(name_or_path)` builds, read without loading a tensor.

    None for a Hub id that is not in the local Hugging Face cache: nothing is downloaded here, so
    nothing can be known until the load itself fetches it. Raises CheckpointError, as
    from_pretrained would, for a name that is not a built-in, a path or a Hub id (with "did you
    mean" for a misspelt built-in name), and for a config anatomy cannot build.
    """
    name = str(name_or_path)
    if name in TOY_MODELS and not Path(name).exists():
        return toy_config(name)
    if name not in PACKAGES and not path_exists(Path(name).expanduser()) and is_hub_id(name):
        check_spelling(name)
        folder = _cached_snapshot(name, revision)
        if folder is None:
            return None
        source = _local(folder, folder.parent.parent)  # <cache>/models--org--name/snapshots/<commit>
    else:
        source = cached(locate(name, revision))  # a built-in package or a local path: nothing is fetched
    if source.kind == "native":
        return native_config(source.path, root=source.root)
    if source.kind == "gguf":
        hf, weights = open_gguf(source.path)
    else:
        hf, _, _ = read_config(source.path)
        weights = Weights(source.path, root=source.root)
    return config_from_hf(hf, weights)[0]


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of a Hub id, if its config.json and weights are in the cache."""
    from huggingface_hub import snapshot_download  # only for a Hub id (0.3 s to import)
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(), local_files_only=True,
                                        allow_patterns=[CONFIG_FILE]))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    weights = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.gguf")
    has_weights = any(next(folder.glob(pattern), None) for pattern in weights)
    return folder if (folder / CONFIG_FILE).is_file() and has_weights else None


__all__ = ["config_of"]
