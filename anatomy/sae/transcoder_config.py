"""circuit-tracer's config.yaml, read as data and bounded by what a transcoder set needs.

    model_kind: transcoder_set | cross_layer_transcoder
    feature_input_hook: mlp.hook_in             feature_output_hook: mlp.hook_out       (names inside block L)
    scan: ..., model_name: ...                  (kept as metadata, written back)
    transcoders: [layer_0.safetensors, hf://org/name/layer_1/params.npz?revision=r, ...]    (optional: one a layer)

A hostile config costs what a real one costs: the file is a regular file of at most MAX_CONFIG_BYTES, read
once; YAML is read with the safe loader (no object is constructed from a tag), without anchors and aliases
(a "billion laughs" tree of aliases is refused before it is built) and at most MAX_DEPTH deep; a list of
files holds at most MAX_LAYERS entries, none twice; every value shown in a message is cut short.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..checkpoints.files import CheckpointError, shorten

CONFIG = "config.yaml"
MAX_CONFIG_BYTES = 1_000_000
MAX_LAYERS = 1024  # the deepest models have ~130 layers; a set is one file (or two) a layer
MAX_DEPTH = 32
MAX_SCALARS = 20_000  # values in one config: a list of 1,024 files, and far more
MAX_NAME = 4096  # a file name or a hook name
KINDS = {"transcoder_set": False, "cross_layer_transcoder": True}  # model_kind -> cross_layer


def yaml_module():
    try:
        import yaml
    except ImportError:
        raise ImportError("circuit-tracer's config.yaml is read with PyYAML: pip install 'anatomy[transcoders]'") from None
    return yaml


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; CheckpointError naming it for a missing
    file, a folder, a device or a pipe (which never ends), a larger file, or one that cannot be read."""
    where = repr(shorten(str(path)))
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{what} {where} is not a regular file (a folder, a device or a pipe)")
        if info.st_size > limit:
            raise CheckpointError(f"{what} {where} is {info.st_size:,} bytes; a real one is under {limit:,}")
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{what} {where} is missing") from None
    except OSError as error:
        raise CheckpointError(f"{what} {where} cannot be read: {error.strerror or error}") from None
    if len(data) > limit:
        raise CheckpointError(f"{what} {where} is more than {limit:,} bytes; a real one is under {limit:,}")
    return data


def parse(text: str):
    """The YAML document `text` as data, with the safe loader (libyaml's where installed), after its events are
    scanned: an alias, nesting past MAX_DEPTH or more than MAX_SCALARS values is refused before anything is
    built (yaml.YAMLError)."""
    yaml = yaml_module()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = scalars = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.YAMLError("it uses an alias (*name); a transcoder config has no need of anchors")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise yaml.YAMLError(f"it is nested more than {MAX_DEPTH} deep")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent):
            scalars += 1
            if scalars > MAX_SCALARS:
                raise yaml.YAMLError(f"it holds more than {MAX_SCALARS:,} values")
    return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader


def read_config(path: Path) -> dict:
    """config.yaml as a dict, checked (module docstring): model_kind one of KINDS, the two hooks names, and
    `transcoders` (if given) a list of distinct file names. CheckpointError naming the file otherwise."""
    yaml = yaml_module()
    where = repr(shorten(str(path)))
    data = read_bounded(path, MAX_CONFIG_BYTES, "transcoder config")
    try:
        config = parse(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise CheckpointError(f"transcoder config {where} is not UTF-8 text (byte {error.start})") from None
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as error:
        reason = shorten(str(error).splitlines()[0] if str(error) else type(error).__name__, 200)
        raise CheckpointError(f"transcoder config {where} is not valid YAML for a transcoder config: {reason}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"transcoder config {where} must hold a mapping, got {type(config).__name__}")
    kind = config.get("model_kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise CheckpointError(f"transcoder config {where}: model_kind={shorten(repr(kind), 80)}; allowed: "
                              f"{', '.join(KINDS)}")
    for key in ("feature_input_hook", "feature_output_hook"):
        value = config.get(key)
        if not isinstance(value, str) or not value or len(value) > MAX_NAME:
            raise CheckpointError(f"transcoder config {where}: {key} must be a hook name such as 'mlp.hook_in', "
                                  f"got {shorten(repr(value), 80)}")
    if "transcoders" in config:
        check_listed(config["transcoders"], where)
    return config


def check_listed(listed, where: str) -> None:
    """CheckpointError unless `listed` is a list of 1 .. MAX_LAYERS distinct file names (counted first)."""
    if not isinstance(listed, list) or not listed:
        raise CheckpointError(f"{where}: transcoders must be a list of file paths, one per layer")
    if len(listed) > MAX_LAYERS:
        raise CheckpointError(f"{where} lists {len(listed):,} transcoder files; a set has one a layer, at most "
                              f"{MAX_LAYERS:,}")
    seen: dict[str, int] = {}
    for layer, name in enumerate(listed):
        if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\0" in name:
            raise CheckpointError(f"{where}: transcoders[{layer}] must be a file path, got {shorten(repr(name), 80)}")
        if name in seen:
            raise CheckpointError(f"{where} lists {shorten(name)!r} twice (layers {seen[name]} and {layer}); each layer "
                                  "has its own file")
        seen[name] = layer
