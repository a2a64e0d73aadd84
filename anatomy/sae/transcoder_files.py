"""Transcoder sets on disk: circuit-tracer's folders (per-layer and cross-layer) and Gemma Scope 2's.

    load_transcoders("path/to/set")                  # circuit-tracer 0.5: config.yaml + layer_{i}.safetensors
    load_transcoders("path/to/clt")                  #   or config.yaml + W_enc_{i} / W_dec_{i}.safetensors
    load_transcoders("gemma-scope-2-270m-pt/transcoder_all", variant="width_16k_l0_small_affine")
    load_transcoders("runs/tc")                      # an `anatomy sae train-transcoders` run: its transcoders/
    save_transcoders(transcoders, "out/")            # circuit-tracer's layout: circuit-tracer loads it back

circuit-tracer's files (circuit_tracer/transcoder/*.py, utils/caching.py), F features, E d_model:

    config.yaml             model_kind: transcoder_set | cross_layer_transcoder, feature_input_hook,
                            feature_output_hook (hook names inside a block: mlp.hook_in, hook_mlp_out, ...),
                            scan; optionally transcoders: [one file per layer]
    layer_{i}.safetensors   W_enc [F, E] (read as x W_enc^T), b_enc [F], W_dec [F, E], b_dec [E],
                            activation_function.threshold [F] (JumpReLU; else ReLU), W_skip [E, E] (x W_skip^T)
    W_enc_{i}.safetensors   W_enc_{i} [F, E], b_enc_{i} [F], b_dec_{i} [E] (layer i's output bias), threshold_{i}
    W_dec_{i}.safetensors   W_dec_{i} [F, L - i, E]: layer i's features to layers i .. L - 1

Gemma Scope 2 (google/gemma-scope-2-*, as SAELens's gemma_3 loader reads it): one folder per layer,
transcoder_all/layer_{i}_{variant}/params.safetensors with w_enc [E, F] (x w_enc), w_dec [F, E] (or
[F, L, E] for a cross-layer one), b_enc, b_dec, threshold, and for the _affine variants
affine_skip_connection [E, E] (x A); its config.json names the points as Hugging Face module outputs
(pre_feedforward_layernorm -> post_feedforward_layernorm: Gemma 3's sandwich norms).

Hostile files get the SAE loader's guarantees (formats.py): config.yaml is read with yaml.safe_load
(no object is ever constructed from it) after a size check; every tensor's name and shape is checked
from the safetensors headers of every layer, and the whole set against the memory available, before
a single tensor is read; nothing is unpickled; every problem is one CheckpointError naming the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..checkpoints.files import CheckpointError, inside, read_json, read_safetensors_header
from ..checkpoints.memory import check_tensors_memory
from ..hook_names import circuit_tracer_hook, circuit_tracer_point, hf_module_point
from .formats import check_shapes, load_sae, read_tensors
from .modules import SAE
from .transcoders import TranscoderSet

CONFIG = "config.yaml"
MAX_CONFIG_BYTES = 1_000_000
KINDS = {"transcoder_set": False, "cross_layer_transcoder": True}  # model_kind -> cross_layer
WRITTEN_KINDS = ("relu", "jumprelu", "batchtopk")  # circuit-tracer 0.5 reads ReLU and JumpReLU (BatchTopK in use is one)
GEMMA_SCOPE_2 = "params.safetensors"
RUN_FOLDER = "transcoders"  # where an `anatomy sae train-transcoders` run keeps its set


def load_transcoders(source: str | os.PathLike, *, dtype: torch.dtype = torch.float32, variant: str | None = None,
                     mlp_out_norm: bool = False) -> TranscoderSet:
    """A TranscoderSet from a circuit-tracer folder (per-layer or cross-layer), a Gemma Scope 2 folder
    (transcoder_all, or the repository holding it), or a training run folder, in evaluation mode.

    dtype: the parameters' dtype (files of bf16 or f16 are converted). variant: Gemma Scope 2's
    width_{W}_l0_{S}[_affine], when the folder holds several. mlp_out_norm: the model normalises its MLP's
    output (Gemma): circuit-tracer's hook_mlp_out is then that norm's output. Raises CheckpointError naming
    the file and the problem (missing, malformed, hostile, sizes that disagree, more than memory holds)
    before any tensor is read."""
    path = Path(source)
    if path.is_dir() and not (path / CONFIG).is_file() and (path / RUN_FOLDER / CONFIG).is_file():
        path = path / RUN_FOLDER
    if path.is_dir() and (path / CONFIG).is_file():
        return _load_circuit_tracer(path, dtype, mlp_out_norm)
    if path.is_dir() and (path / "transcoder_all").is_dir():
        path = path / "transcoder_all"
    if path.is_dir() and any(path.glob(f"layer_*/{GEMMA_SCOPE_2}")):
        return _load_gemma_scope_2(path, dtype, variant)
    if not path.exists():
        raise CheckpointError(f"no transcoder set at {str(source)!r}: not a folder")
    raise CheckpointError(f"no transcoder set in {str(path)!r}: expected {CONFIG} with layer_{{i}}.safetensors or "
                          f"W_enc_{{i}}/W_dec_{{i}}.safetensors (circuit-tracer), transcoder_all/layer_{{i}}_*/{GEMMA_SCOPE_2} "
                          f"(Gemma Scope 2), or a run folder with {RUN_FOLDER}/")


# ---- circuit-tracer ---------------------------------------------------------------------------------
def _yaml():
    try:
        import yaml
    except ImportError:
        raise ImportError("circuit-tracer's config.yaml is read with PyYAML: pip install 'anatomy[transcoders]'") from None
    return yaml


def read_config(path: Path) -> dict:
    """config.yaml as a dict, read with yaml.safe_load after checking its size; CheckpointError otherwise."""
    yaml = _yaml()
    where = repr(str(path))
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"transcoder config {where} is {path.stat().st_size:,} bytes; a real one is under "
                              f"{MAX_CONFIG_BYTES:,}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as error:
        raise CheckpointError(f"transcoder config {where} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"transcoder config {where} must hold a mapping, got {type(config).__name__}")
    kind = config.get("model_kind")
    if kind not in KINDS:
        raise CheckpointError(f"transcoder config {where}: model_kind={kind!r}; allowed: {', '.join(KINDS)}")
    for key in ("feature_input_hook", "feature_output_hook"):
        if not isinstance(config.get(key), str):
            raise CheckpointError(f"transcoder config {where}: {key} must be a hook name such as 'mlp.hook_in', "
                                  f"got {config.get(key)!r}")
    return config


def _load_circuit_tracer(folder: Path, dtype: torch.dtype, mlp_out_norm: bool) -> TranscoderSet:
    config = read_config(folder / CONFIG)
    where = str(folder / CONFIG)
    try:
        points = [circuit_tracer_point(config[key], 0, mlp_out_norm).replace(".0.", ".L.", 1)
                  for key in ("feature_input_hook", "feature_output_hook")]
    except ValueError as error:
        raise CheckpointError(f"transcoder config {where!r}: {error}") from None
    metadata = {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool)) and k != "model_kind"}
    cross_layer = KINDS[config["model_kind"]]
    if cross_layer:
        layers = _clt_layers(folder, dtype)
    elif "transcoders" in config:
        layers = _listed_layers(folder, config["transcoders"], where, dtype)
    else:
        layers = _plt_layers(folder, _numbered(folder, "layer_{}.safetensors", where), dtype)
    return TranscoderSet(layers, cross_layer=cross_layer, input_point=points[0], output_point=points[1],
                         metadata=metadata).eval()


def _numbered(folder: Path, pattern: str, where: str) -> list[Path]:
    """The files pattern.format(0), .format(1), ... of `folder`: every layer from 0, none missing."""
    regex = re.compile(re.escape(pattern).replace(r"\{\}", r"(\d+)"))
    found = sorted(int(m.group(1)) for p in folder.iterdir() if (m := regex.fullmatch(p.name)))
    if not found:
        raise CheckpointError(f"{where!r}: no {pattern.format('{i}')} beside it")
    if found != list(range(len(found))):
        missing = sorted(set(range(max(found) + 1)) - set(found))
        raise CheckpointError(f"{where!r}: {pattern.format(missing[0] if missing else found[-1])} is missing or repeated; "
                              f"a set has one file for every layer 0 .. {max(found)}")
    return [folder / pattern.format(i) for i in found]


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor: shape} of a safetensors file, from its header alone (CheckpointError if malformed)."""
    if not path.is_file():
        raise CheckpointError(f"transcoder weights {str(path)!r} are missing")
    return {name: shape for name, (_, shape) in read_safetensors_header(path).items()}


def _plt_layers(folder: Path, files: list[Path], dtype: torch.dtype) -> list[SAE]:
    """Per-layer files in circuit-tracer's layout, every header checked before any tensor is read."""
    first = _header(files[0])
    if len(first.get("W_enc", ())) != 2 or len(first.get("b_dec", ())) != 1:
        raise CheckpointError(f"{str(files[0])!r}: a circuit-tracer transcoder holds W_enc [F, E] and b_dec [E]; "
                              f"found {sorted(first)}")
    (d_transcoder, d_model), d_out = first["W_enc"], first["b_dec"][0]
    expected = {"W_enc": (d_transcoder, d_model), "b_enc": (d_transcoder,), "W_dec": (d_transcoder, d_out), "b_dec": (d_out,)}
    optional = {"activation_function.threshold": (d_transcoder,), "W_skip": (d_out, d_model)}
    present = [k for k in optional if k in first]
    for path in files:
        shapes = _header(path)
        check_shapes(str(path), shapes, expected, optional)
        if [k for k in optional if k in shapes] != present:
            raise CheckpointError(f"{str(path)!r} holds {sorted(shapes)}; layer 0 holds {sorted(first)}: every layer "
                                  "of a set has the same tensors")
    check_tensors_memory(str(folder), [s for s in {**expected, **optional}.values()] * len(files), dtype,
                         "the transcoder set")
    layers = []
    for path in files:
        tensors = read_tensors(path, expected, dtype, optional, what="transcoder weights")
        layers.append(_sae(tensors["W_enc"].T, tensors["b_enc"], tensors["W_dec"], tensors["b_dec"],
                           tensors.get("activation_function.threshold"), tensors.get("W_skip"), dtype))
    return layers


def _sae(W_enc, b_enc, W_dec, b_dec, threshold=None, W_skip=None, dtype=torch.float32) -> SAE:
    """A transcoder SAE from its tensors in anatomy's layout: W_enc [E, F], W_dec [F, O], W_skip [O, E]."""
    (d_in, d_sae), d_out = W_enc.shape, W_dec.shape[-1]
    sae = SAE(d_in, d_sae, kind="jumprelu" if threshold is not None else "relu", d_out=d_out, transcoder=True,
              skip=W_skip is not None, apply_b_dec_to_input=False, dtype=dtype, seed=None)
    with torch.no_grad():
        for name, value in (("W_enc", W_enc), ("b_enc", b_enc), ("W_dec", W_dec), ("b_dec", b_dec),
                            ("threshold", threshold), ("W_skip", W_skip)):
            if value is not None:
                getattr(sae, name).copy_(value)
    return sae.eval()


def _clt_layers(folder: Path, dtype: torch.dtype) -> list[SAE]:
    """A cross-layer transcoder in circuit-tracer's lazy layout, every header checked first."""
    where = str(folder / CONFIG)
    encoders = _numbered(folder, "W_enc_{}.safetensors", where)
    n_layers = len(encoders)
    first = _header(encoders[0])
    if len(first.get("W_enc_0", ())) != 2:
        raise CheckpointError(f"{str(encoders[0])!r}: a cross-layer transcoder's file holds W_enc_0 [F, E]; found {sorted(first)}")
    d_transcoder, d_model = first["W_enc_0"]
    thresholded = "threshold_0" in first
    plans, total = [], []
    for i, path in enumerate(encoders):
        expected = {f"W_enc_{i}": (d_transcoder, d_model), f"b_enc_{i}": (d_transcoder,), f"b_dec_{i}": (d_model,)}
        if thresholded:
            expected[f"threshold_{i}"] = (d_transcoder,)
        check_shapes(str(path), _header(path), expected)
        decoder = folder / f"W_dec_{i}.safetensors"
        decoder_shape = {f"W_dec_{i}": (d_transcoder, n_layers - i, d_model)}
        check_shapes(str(decoder), _header(decoder), decoder_shape)
        plans.append((path, expected, decoder, decoder_shape))
        total += list(expected.values()) + list(decoder_shape.values()) + [(n_layers - i, d_model)]
    check_tensors_memory(str(folder), total, dtype, "the transcoder set")
    layers = []
    for i, (path, expected, decoder, decoder_shape) in enumerate(plans):
        encoder = read_tensors(path, expected, dtype, what="transcoder weights")
        W_dec = read_tensors(decoder, decoder_shape, dtype, what="transcoder weights")[f"W_dec_{i}"]
        layers.append(_sae(encoder[f"W_enc_{i}"].T, encoder[f"b_enc_{i}"], W_dec.flatten(1),  # (F, L-i, E) -> (F, (L-i) E)
                           _first_block(encoder[f"b_dec_{i}"], n_layers - i), encoder.get(f"threshold_{i}"), None, dtype))
    return layers


def _first_block(vector: torch.Tensor, blocks: int) -> torch.Tensor:
    """[E] -> [blocks E]: the vector, then zeros (a CLT layer's bias, written to its own output only)."""
    return torch.cat([vector, vector.new_zeros((blocks - 1) * vector.numel())])


def _listed_layers(folder: Path, listed, where: str, dtype: torch.dtype) -> list[SAE]:
    """config.yaml's `transcoders`: one local file per layer, inside the folder (circuit-tracer's layout,
    Gemma Scope 2's params.safetensors, or Gemma Scope's params.npz)."""
    if not isinstance(listed, list) or not listed or not all(isinstance(p, str) for p in listed):
        raise CheckpointError(f"{where!r}: transcoders must be a list of file paths, one per layer")
    remote = [p for p in listed if "://" in p]
    if remote:
        raise CheckpointError(f"{where!r} names files to download ({remote[0]!r}); anatomy reads a transcoder set "
                              "from local files: download them into the folder and list their paths")
    files = [inside(folder / p, folder, "transcoder file") for p in listed]
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{where!r} lists {str(path)!r}, which is missing")
    if all(path.suffix == ".npz" for path in files):
        return [load_sae(path, dtype=dtype) for path in files]
    if "w_enc" in _header(files[0]):
        return _gemma_scope_2_layers(files, dtype)
    return _plt_layers(folder, files, dtype)


# ---- Gemma Scope 2 -----------------------------------------------------------------------------------
def _load_gemma_scope_2(folder: Path, dtype: torch.dtype, variant: str | None) -> TranscoderSet:
    by_variant: dict[str, dict[int, Path]] = {}
    for params in folder.glob(f"layer_*/{GEMMA_SCOPE_2}"):
        match = re.fullmatch(r"layer_(\d+)_(.+)", params.parent.name)
        if match:
            by_variant.setdefault(match.group(2), {})[int(match.group(1))] = params
    if variant is None and len(by_variant) != 1:
        raise CheckpointError(f"{str(folder)!r} holds Gemma Scope 2 transcoders of several variants; choose one: "
                              f"{', '.join(sorted(by_variant))}")
    variant = variant if variant is not None else next(iter(by_variant))
    if variant not in by_variant:
        raise CheckpointError(f"{str(folder)!r} has no Gemma Scope 2 variant {variant!r}; allowed: {', '.join(sorted(by_variant))}")
    layers = by_variant[variant]
    if sorted(layers) != list(range(len(layers))):
        missing = sorted(set(range(max(layers) + 1)) - set(layers))
        raise CheckpointError(f"{str(folder)!r}: layer_{missing[0]}_{variant} is missing; a set has every layer 0 .. {max(layers)}")
    files = [layers[i] for i in range(len(layers))]
    config = read_json(files[0].parent / "config.json", "Gemma Scope 2 config") \
        if (files[0].parent / "config.json").is_file() else {}
    points = []
    for key, default in (("hf_hook_point_in", "blocks.L.mlp_norm.out"), ("hf_hook_point_out", "blocks.L.mlp_out_norm.out")):
        name = config.get(key)
        try:
            points.append(re.sub(r"^blocks\.\d+\.", "blocks.L.", hf_module_point(name)) if isinstance(name, str) else default)
        except ValueError as error:
            raise CheckpointError(f"{str(files[0].parent / 'config.json')!r}: {key}: {error}") from None
    metadata = {"scan": f"{folder.parent.name}/{folder.name}/{variant}"}
    if isinstance(config.get("model_name"), str):
        metadata["model_name"] = config["model_name"]
    layer_saes = _gemma_scope_2_layers(files, dtype)
    cross_layer = layer_saes[0].d_out != layer_saes[0].d_in  # layer 0 of a CLT writes every layer
    return TranscoderSet(layer_saes, cross_layer=cross_layer, input_point=points[0], output_point=points[1],
                         metadata=metadata).eval()


def _gemma_scope_2_layers(files: list[Path], dtype: torch.dtype) -> list[SAE]:
    """Gemma Scope 2's params.safetensors, one a layer: w_enc [E, F], w_dec [F, E] (per-layer) or [F, L, E]
    (cross-layer: layer i keeps its rows for layers i .. L - 1), every header checked first."""
    first = _header(files[0])
    if len(first.get("w_enc", ())) != 2 or len(first.get("w_dec", ())) not in (2, 3):
        raise CheckpointError(f"{str(files[0])!r}: a Gemma Scope 2 transcoder holds w_enc [E, F] and w_dec [F, E] "
                              f"or [F, L, E]; found {sorted(first)}")
    (d_model, d_transcoder), n_layers = first["w_enc"], len(files)
    cross_layer = len(first["w_dec"]) == 3
    w_dec = (d_transcoder, n_layers, d_model) if cross_layer else (d_transcoder, d_model)
    expected = {"w_enc": (d_model, d_transcoder), "w_dec": w_dec, "b_enc": (d_transcoder,), "b_dec": (d_model,),
                "threshold": (d_transcoder,)}
    optional = {"affine_skip_connection": (d_model, d_model)}
    for path in files:
        shapes = _header(path)
        check_shapes(str(path), shapes, expected, optional)
        if ("affine_skip_connection" in shapes) != ("affine_skip_connection" in first):
            raise CheckpointError(f"{str(path)!r}: every layer of a set has an affine_skip_connection, or none does")
    check_tensors_memory(str(files[0].parent.parent), [*expected.values(), *optional.values()] * n_layers, dtype,
                         "the transcoder set")
    layers = []
    for i, path in enumerate(files):
        t = read_tensors(path, expected, dtype, optional, what="transcoder weights")
        decoder, bias, skip = t["w_dec"], t["b_dec"], t.get("affine_skip_connection")
        if cross_layer:
            decoder = decoder[:, i:].flatten(1)  # (F, L - i, E) -> (F, (L - i) E): the rows to layers i and later
            bias = _first_block(bias, n_layers - i)
            skip = None if skip is None else torch.cat([skip.T, skip.new_zeros((n_layers - i - 1) * d_model, d_model)])
        else:
            skip = None if skip is None else skip.T  # x A = x (A^T)^T: W_skip [E_out, E_in]
        layers.append(_sae(t["w_enc"], t["b_enc"], decoder, bias, t["threshold"], skip, dtype))
    return layers


# ---- writing ------------------------------------------------------------------------------------------
WRITTEN = ("config.yaml", "layer_*.safetensors", "W_enc_*.safetensors", "W_dec_*.safetensors")


def save_transcoders(transcoders: TranscoderSet, folder: str | os.PathLike, *, scan: str | None = None) -> Path:
    """Write `transcoders` as circuit-tracer 0.5 writes a set (module docstring): config.yaml and
    layer_{i}.safetensors, or W_enc_{i} / W_dec_{i}.safetensors for a cross-layer one. The folder is
    written whole or not at all (a staging folder beside it, moved into place), and files of an
    earlier set in it are replaced. scan: circuit-tracer's name for the set (default: the metadata's,
    else the folder's name). Raises ValueError before writing for what circuit-tracer cannot read: a
    TopK set, points it has no hook for, a cross-layer set with a skip connection."""
    from ..checkpoints.writing import staged_folder
    from safetensors.torch import save_file

    if transcoders.kind not in WRITTEN_KINDS:
        raise ValueError(f"circuit-tracer 0.5 reads ReLU and JumpReLU transcoders; kind={transcoders.kind!r} has no such "
                         f"file (allowed: {', '.join(WRITTEN_KINDS)}; BatchTopK is written as the JumpReLU it is in use)")
    hooks = [circuit_tracer_hook(transcoders.input_point(0)), circuit_tracer_hook(transcoders.output_point(0))]
    skip = transcoders.layers[0].W_skip is not None
    if transcoders.cross_layer and skip:
        raise ValueError("circuit-tracer 0.5's cross-layer files hold no skip connection (W_skip): this set's would be lost")
    folder = Path(folder)
    config = {**transcoders.metadata, "model_kind": "cross_layer_transcoder" if transcoders.cross_layer else "transcoder_set",
              "feature_input_hook": hooks[0], "feature_output_hook": hooks[1],
              "scan": scan or transcoders.metadata.get("scan") or folder.resolve().name}
    with staged_folder(folder, replaces=WRITTEN) as staging:
        for layer, sae in enumerate(transcoders.layers):
            state = {name: getattr(sae, name).detach().cpu().contiguous() for name in ("W_enc", "b_enc", "W_dec")}
            state["W_enc"] = state["W_enc"].T.contiguous()  # (E, F) -> (F, E): circuit-tracer's F.linear layout
            threshold = sae.threshold.detach().cpu().contiguous() if sae.kind != "relu" else None
            if transcoders.cross_layer:
                tensors = {f"W_enc_{layer}": state["W_enc"], f"b_enc_{layer}": state["b_enc"],
                           f"b_dec_{layer}": transcoders.output_bias(layer).detach().cpu().contiguous()}
                if threshold is not None:
                    tensors[f"threshold_{layer}"] = threshold
                save_file(tensors, str(staging / f"W_enc_{layer}.safetensors"))
                decoder = transcoders.decoder_vectors(layer).detach().cpu().contiguous()  # (F, L - layer, E)
                save_file({f"W_dec_{layer}": decoder}, str(staging / f"W_dec_{layer}.safetensors"))
                continue
            tensors = {**state, "b_dec": sae.b_dec.detach().cpu().contiguous()}
            if threshold is not None:
                tensors["activation_function.threshold"] = threshold
            if skip:
                tensors["W_skip"] = sae.W_skip.detach().cpu().contiguous()
            save_file(tensors, str(staging / f"layer_{layer}.safetensors"))
        (staging / CONFIG).write_text(_yaml().safe_dump(config, sort_keys=False), encoding="utf-8")
        for path in staging.iterdir():
            os.chmod(path, 0o644)
    return folder
