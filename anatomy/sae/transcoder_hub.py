"""The field's transcoder sets by name: Hub ids and circuit-tracer's short names, fetched file by file into
the Hugging Face cache (huggingface_hub, through checkpoints/hub.py: HF_HUB_OFFLINE, HF_HUB_CACHE, HF_TOKEN).

    "gemma"    circuit-tracer 0.5.0's preset (circuit_tracer/utils/hf_utils.py) for mwhanna/gemma-scope-transcoders:
               its config.yaml lists, for each of gemma-2-2b's 26 layers, one Gemma Scope transcoder of
               16,384 features (hf://google/gemma-scope-2b-pt-transcoders/layer_{i}/width_16k/average_l0_{n}/
               params.npz), read after the pre-MLP norm and predicting the post-MLP norm's output
    "llama"    its preset for mntss/transcoder-Llama-3.2-1B: Llama-3.2-1B's per-layer transcoders
    "org/name[/folder][@revision]"   a repository, or a folder of one, in circuit-tracer's layout (config.yaml)
               or Gemma Scope 2's (transcoder_all/layer_{i}_{variant}/params.safetensors; give the variant,
               or name it as the last folder: google/gemma-scope-2-270m-pt/transcoder_all/width_16k_l0_small)

The repository's file list says which layout it is (online, the Hub's listing; offline, the cached
snapshot's), and only the files the set needs are fetched: config.yaml first, then the layer files it lists
or names, or one variant's params.safetensors and its first config.json. Offline and not cached, the error
names the id, the cache and the `hf download` command that fetches exactly those files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..checkpoints.files import CheckpointError, shorten
from ..checkpoints.hub import cache_dir, fetch, fetch_files, hub_errors, offline
from .transcoder_config import CONFIG, KINDS, MAX_LAYERS, read_config

SHORT_NAMES = {"gemma": "mwhanna/gemma-scope-transcoders", "llama": "mntss/transcoder-Llama-3.2-1B"}
MLP_OUT_NORM = {"gemma"}  # gemma-2 normalises its MLP's output: hook_mlp_out is that norm's output
PART = r"[A-Za-z0-9][\w.-]{0,95}"
REFERENCE = re.compile(rf"(?P<repo>{PART}/{PART})(?P<folder>(/[\w.=-]{{1,200}}){{0,8}})(@(?P<revision>[\w./-]{{1,100}}))?")
MAX_LISTED = 200_000  # files of a repository looked at


@dataclass(frozen=True)
class HubSet:
    """A set found on the Hub: the local folder to read (in the snapshot), the repository's cache folder
    (every file must resolve inside it), the Gemma Scope 2 variant chosen, and whether hook_mlp_out is the
    MLP norm's output."""

    folder: Path
    root: Path
    variant: str | None
    mlp_out_norm: bool


def hub_source(text: str) -> tuple[str, str, str | None] | None:
    """(repository, folder in it, revision) of a short name or of 'org/name[/folder][@revision]'; None for
    anything else (a path, a typo)."""
    if text in SHORT_NAMES:
        return SHORT_NAMES[text], "", None
    match = REFERENCE.fullmatch(text)
    if match is None or any(part in (".", "..") for part in text.split("@")[0].split("/")):
        return None
    return match.group("repo"), match.group("folder").strip("/"), match.group("revision")


def resolve(text: str, variant: str | None, revision: str | None, command: str) -> HubSet:
    """The local copy of the set `text` names (module docstring), fetching only its files. CheckpointError
    naming the name, the repository and the cache for a set not cached offline (with `command`, the one that
    fetches it, when many files are missing), a repository holding no set where named, or a layout anatomy
    does not read."""
    repo, folder, pinned = hub_source(text)
    revision = revision or pinned
    named = f"transcoder set {text!r}" + (f" ({repo})" if text in SHORT_NAMES else "")
    try:
        files = _listing(repo, revision, command)
        prefix = f"{folder}/" if folder else ""
        if prefix + CONFIG in files:
            snapshot = _circuit_tracer_files(repo, revision, prefix, files, named, command)
            return HubSet(snapshot / folder, _repository_folder(repo), None, text in MLP_OUT_NORM)
        base, variant, needed = _gemma_scope_2_files(files, folder, variant, named)
        snapshot = fetch_files(repo, needed, revision, subject=f"the {named}: {{n}} of its {len(needed)} files",
                               command=command)
        return HubSet(snapshot / base, _repository_folder(repo), variant, False)
    except CheckpointError as error:
        message = str(error)
        raise CheckpointError(message if message.startswith(("the " + named, named)) else f"{named}: {message}") from None


def _repository_folder(repo: str) -> Path:
    return cache_dir() / f"models--{repo.replace('/', '--')}"


def _listing(repo: str, revision: str | None, command: str) -> set[str]:
    """The repository's files: the Hub's listing, or offline the cached snapshot's (CheckpointError with the
    command that fetches the set when nothing of it is cached)."""
    if offline():
        if not (_repository_folder(repo) / "snapshots").is_dir():
            raise CheckpointError(f"it is no local folder, and {repo!r} is not in the Hugging Face cache "
                                  f"{str(cache_dir())!r}: HF_HUB_OFFLINE is set: unset it and load the set once with "
                                  f"network (`{command}` fetches only its files)")
        snapshot = fetch(repo, [], revision)  # the snapshot folder of the revision, or the not-cached error
        found = set()
        for path in snapshot.rglob("*"):
            if len(found) >= MAX_LISTED:
                break
            if not path.is_dir():
                found.add(path.relative_to(snapshot).as_posix())
        return found
    from huggingface_hub import HfApi

    with hub_errors(repo, revision):
        return set(HfApi().list_repo_files(repo, revision=revision, token=os.environ.get("HF_TOKEN") or None)[:MAX_LISTED])


def _circuit_tracer_files(repo: str, revision: str | None, prefix: str, files: set[str], named: str, command: str) -> Path:
    """Fetch a circuit-tracer folder's config.yaml, then the layer files it lists (those in this repository;
    hf:// ones of others are fetched as the loader reads them) or, without a list, every numbered file."""
    snapshot = fetch_files(repo, [prefix + CONFIG], revision, subject=f"the {named}'s {CONFIG}")
    config = read_config(snapshot / prefix / CONFIG)
    if "transcoders" in config:
        needed = [prefix + name for name in config["transcoders"] if "://" not in name]
    else:
        pattern = r"W_(enc|dec)_\d+" if KINDS[config["model_kind"]] else r"layer_\d+"
        needed = sorted(f for f in files if re.fullmatch(re.escape(prefix) + pattern + r"\.safetensors", f))
        if len(needed) > 2 * MAX_LAYERS:
            raise CheckpointError(f"{len(needed):,} layer files in {repo}/{prefix}; a set has at most {MAX_LAYERS:,} layers")
        if not needed:
            raise CheckpointError(f"{repo}/{prefix}{CONFIG} names no layer files beside it "
                                  + ("in the cache (HF_HUB_OFFLINE is set: unset it to fetch them)" if offline() else ""))
    if needed:
        fetch_files(repo, needed, revision, subject=f"the {named}: {{n}} of its {len(needed)} files", command=command)
    return snapshot


def _gemma_scope_2_files(files: set[str], folder: str, variant: str | None, named: str) -> tuple[str, str, list[str]]:
    """(the folder holding the layer folders, the variant, the files to fetch) of a Gemma Scope 2 repository:
    the folder itself, its transcoder_all, or (a folder ending in a variant's name) its parent."""
    parent, _, last = folder.rpartition("/")
    for base, implied in ((folder, None), (f"{folder}/transcoder_all".strip("/"), None), (parent, last)):
        prefix = f"{base}/" if base else ""
        pattern = re.compile(re.escape(prefix) + r"layer_(\d{1,6})_([\w.-]{1,200})/params\.safetensors")
        found = [(m.group(2), int(m.group(1)), f) for f in sorted(files) if (m := pattern.fullmatch(f))]
        variants = sorted({v for v, _, _ in found})
        if found and (implied is None or implied in variants):
            break
    else:
        where = f"{folder!r}" if folder else "its root"
        raise CheckpointError(f"the repository holds no transcoder set at {where}" + (" in the cache" if offline() else "")
                              + f": expected {CONFIG} (circuit-tracer) or transcoder_all/layer_{{i}}_{{variant}}/"
                              "params.safetensors (Gemma Scope 2)")
    variant = variant or implied
    if variant is None and len(variants) != 1:
        raise CheckpointError(f"{base or 'the repository'} holds Gemma Scope 2 transcoders of several variants; choose "
                              f"one (variant=, or as the id's last folder): {', '.join(variants[:20])}")
    variant = variant if variant is not None else variants[0]
    layers = {layer: f for v, layer, f in found if v == variant}
    if not layers:
        raise CheckpointError(f"{base or 'the repository'} has no Gemma Scope 2 variant {shorten(repr(variant), 80)}; "
                              f"allowed: {', '.join(variants[:20])}")
    if len(layers) > MAX_LAYERS:
        raise CheckpointError(f"{len(layers):,} layers of {variant!r}; a set has at most {MAX_LAYERS:,}")
    needed = [layers[i] for i in sorted(layers)]
    config = needed[0].rpartition("/")[0] + "/config.json"
    return base, variant, needed + ([config] if config in files else [])


def fetch_uris(uris: list[str], subject: str, command: str) -> dict[str, tuple[Path, Path]]:
    """{uri: (the local file, its repository's cache folder)} of hf://org/name/path/to/file[?revision=r] URIs,
    fetched a repository at a time (offline, every missing file of one is named in one command).
    CheckpointError for a URI that is not one."""
    groups: dict[tuple[str, str | None], list[tuple[str, str]]] = {}
    for uri in uris:
        parts = urlsplit(uri)
        path = parts.path.strip("/").split("/")
        revision = parse_qs(parts.query).get("revision", [None])[0]
        repo = f"{parts.netloc}/{path[0]}" if path and path[0] else ""
        file = "/".join(path[1:])
        if not re.fullmatch(f"{PART}/{PART}", repo) or not file or any(p in ("", ".", "..") for p in path[1:]) or \
                (revision is not None and not re.fullmatch(r"[\w./-]{1,100}", revision)):
            raise CheckpointError(f"{subject} {shorten(uri)!r}, which is not hf://org/name/path/to/file[?revision=r]")
        groups.setdefault((repo, revision), []).append((uri, file))
    found = {}
    for (repo, revision), members in groups.items():
        snapshot = fetch_files(repo, [file for _, file in members], revision,
                               subject=f"{subject} {len(members)} files of {repo!r}; {{n}} of them", command=command)
        found.update({uri: (snapshot / file, _repository_folder(repo)) for uri, file in members})
    return found
