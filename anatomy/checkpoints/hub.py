"""Hub ids ("org/name", or a canonical "gpt2"): a snapshot in huggingface_hub's standard cache.

Only what anatomy reads is fetched: config.json, the safetensors weights (or their index and
shards), the tokenizer files and, for sentence-transformers models, their pooling modules;
pytorch_model.bin only when the repository has no safetensors. The environment is honoured as
huggingface_hub documents it, read at each call:

    HF_HUB_OFFLINE=1      use the cache only (no network)
    HF_HUB_CACHE          the cache folder (default $HF_HOME/hub, HF_HOME default ~/.cache/huggingface)
    HF_TOKEN              the token for gated or private repositories
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from .files import CheckpointError

# "org/name" or a canonical name without an org ("gpt2"), as the Hub spells repository ids.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
CONFIG_AND_TOKENIZER = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.txt", "vocab.json", "merges.txt", "chat_template.jinja",
    "modules.json", "sentence_bert_config.json", "*_Pooling/config.json",
]
SAFETENSORS = ["*.safetensors", "*.safetensors.index.json"]
PICKLED = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
MAX_NAMED = 4  # files named in one `hf download` command: a message stays one short line


def is_hub_id(name: str) -> bool:
    return bool(HUB_ID.fullmatch(name)) and not name.endswith((".gguf", ".json", ".safetensors", ".bin"))


def cache_dir() -> Path:
    """The hub cache folder: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def snapshot(repo_id: str, revision: str | None = None) -> tuple[Path, Path]:
    """(the snapshot folder, the repository's cache folder) of `repo_id`, downloaded if needed.

    Raises CheckpointError naming the id when it is not cached while offline (with the cache folder
    and the command that fetches it), gated without a token, missing, or unreachable."""
    folder = _download(repo_id, revision, CONFIG_AND_TOKENIZER + SAFETENSORS)
    if not any(folder.glob("*.safetensors")):
        folder = _download(repo_id, revision, CONFIG_AND_TOKENIZER + PICKLED)
    return folder, folder.parent.parent  # <cache>/models--org--name/snapshots/<commit>


def fetch(repo_id: str, patterns: list[str], revision: str | None = None) -> Path:
    """The snapshot folder of `repo_id` holding the files that match `patterns` (glob patterns of paths in
    the repository), downloaded if needed; the errors of `snapshot`."""
    return _download(repo_id, revision, patterns)


def fetch_files(repo_id: str, files: list[str], revision: str | None = None, subject: str | None = None,
                command: str | None = None) -> Path:
    """The snapshot folder of `repo_id` holding exactly `files` (paths in the repository), each downloaded if
    needed. Offline, every missing file is named at once, in the one command that fetches them all (the
    message starts with `subject` if given, {n} in it the number missing; `command`, if given, is named
    instead of `hf download` when more than a few files are missing, so that the line stays short)."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    if offline():
        missing = [f for f in files if not isinstance(try_to_load_from_cache(repo_id, f, cache_dir=cache_dir(),
                                                                              revision=revision), str)]
        if missing:
            raise CheckpointError(not_cached(repo_id, revision, missing, subject and subject.replace("{n}", str(len(missing))),
                                             command))
    folder = None
    with hub_errors(repo_id, revision, files):
        for file in files:
            local = Path(hf_hub_download(repo_id, file, revision=revision, cache_dir=cache_dir(),
                                         local_files_only=offline(), token=os.environ.get("HF_TOKEN") or None))
            folder = folder or local.parents[len(Path(file).parts) - 1]
    return folder


def not_cached(repo_id: str, revision: str | None, files: list[str] | None = None, subject: str | None = None,
               command: str | None = None) -> str:
    """The message for a repository (or some of its files) that is not in the cache, with the command that
    fetches it: unset HF_HUB_OFFLINE, or `hf download` (or `command`, for more than MAX_NAMED files)."""
    files = list(files or [])
    download = f"`hf download {repo_id}" + "".join(f" {f}" for f in files) + \
               (f" --revision {revision}" if revision else "") + "`"
    if command and len(files) > MAX_NAMED:
        download = f"`{command}` (it fetches all {len(files)})"
    # name only what is set: advice about a variable the user never set would mislead
    how = (f"HF_HUB_OFFLINE is set: unset it and load it once with network, or run {download}" if offline()
           else f"the Hub cannot be reached from here: run {download} where it can, or copy the folder here")
    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    subject = subject or (f"{len(files)} file{'s' if len(files) != 1 else ''} of {where}" if files else where)
    return f"{subject} {'are' if files and len(files) != 1 else 'is'} not in the Hugging Face cache {str(cache_dir())!r}: {how}"


def _download(repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    # imported here: huggingface_hub (and its HTTP client) takes 0.3 s to import, which every command
    # paid before it knew whether it would fetch anything
    from huggingface_hub import snapshot_download

    with hub_errors(repo_id, revision):
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(), allow_patterns=patterns,
                                      local_files_only=offline(), token=os.environ.get("HF_TOKEN") or None))


@contextmanager
def hub_errors(repo_id: str, revision: str | None, files: list[str] | None = None):
    """huggingface_hub's errors, inside the block, as one CheckpointError naming the id (and the files)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        yield
    except GatedRepoError:
        raise CheckpointError(
            f"{where} is a gated model: accept its license on https://huggingface.co/{repo_id}, then set HF_TOKEN "
            "to a token of that account (or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{where} is not a local folder, a built-in name, nor a repository on the Hugging Face "
                              "Hub (a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{where}: the Hub repository has no such revision") from None
    except LocalEntryNotFoundError:
        if "/" not in repo_id:  # a bare name that is not cached: a mistyped name or path more likely than a Hub id
            raise CheckpointError(f"{where} is not a built-in name (`anatomy models` lists them), a local folder or a "
                                  "file, nor a model in the Hugging Face cache; a Hub id reads 'org/name'") from None
        subject = None if files else f"{where} is not a local folder or built-in name, and"
        raise CheckpointError(not_cached(repo_id, revision, files, subject)) from None
    except EntryNotFoundError:
        raise CheckpointError(f"{where} has no file {', '.join(map(repr, files or []))[:300]}") from None
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise CheckpointError(f"{where} could not be fetched from the Hugging Face Hub: {str(error)[:300]}") from None
