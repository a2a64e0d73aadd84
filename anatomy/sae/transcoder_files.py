"""Transcoder sets on disk and on the Hub: circuit-tracer's folders (per-layer and cross-layer), Gemma Scope's
and Gemma Scope 2's, by path, by Hub id or by circuit-tracer's short names.

    load_transcoders("gemma")                        # circuit-tracer 0.5's preset: Gemma Scope's, for gemma-2-2b
    load_transcoders("llama")                        #   and Llama-3.2-1B's (transcoder_hub.py)
    load_transcoders("mntss/transcoder-Llama-3.2-1B")                  # a Hub id (only the files needed fetched)
    load_transcoders("path/to/set")                  # circuit-tracer 0.5: config.yaml + layer_{i}.safetensors
    load_transcoders("path/to/clt")                  #   or config.yaml + W_enc_{i} / W_dec_{i}.safetensors
    load_transcoders("gemma-scope-2-270m-pt/transcoder_all", variant="width_16k_l0_small_affine")
    load_transcoders("runs/tc")                      # an `anatomy sae train-transcoders` run: its transcoders/
    save_transcoders(transcoders, "out/")            # circuit-tracer's layout: circuit-tracer loads it back

circuit-tracer's files (circuit_tracer/transcoder/*.py, utils/caching.py), F features, E d_model:

    config.yaml             model_kind, feature_input_hook, feature_output_hook, scan; optionally transcoders:
                            one file per layer, local or hf://org/name/path?revision=r (transcoder_config.py)
    layer_{i}.safetensors   W_enc [F, E] (read as x W_enc^T), b_enc [F], W_dec [F, E], b_dec [E],
                            activation_function.threshold [F] (JumpReLU; else ReLU), W_skip [E, E] (x W_skip^T)
    W_enc_{i}.safetensors   W_enc_{i} [F, E], b_enc_{i} [F], b_dec_{i} [E] (layer i's output bias), threshold_{i}
    W_dec_{i}.safetensors   W_dec_{i} [F, L - i, E]: layer i's features to layers i .. L - 1

and Gemma Scope's params.npz and Gemma Scope 2's params.safetensors (gemma_scope_files.py).

Only headers are read here: every name, shape, dtype and size is checked for every layer (mapped.py), and the
set is returned with its layers read when first used, memory-mapped, and checked finite then
(transcoder_layers.py). Nothing is unpickled; YAML constructs no object; every file must resolve inside
the set's folder (a Hub repository's cache folder for a download). Every problem is one CheckpointError
naming the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..checkpoints.files import CheckpointError, inside, shorten
from ..checkpoints.memory import check_tensors_memory
from ..hook_names import circuit_tracer_hook, circuit_tracer_point
from .formats import DTYPES, check_shapes
from .gemma_scope_files import gemma_scope_2_folder, gemma_scope_plans
from .mapped import mapped_file
from .transcoder_config import CONFIG, KINDS, MAX_LAYERS, check_listed, read_config, yaml_module
from .transcoder_layers import LayerPlan, LayerSpec, LazyLayers, first_block
from .transcoders import TranscoderSet

WRITTEN_KINDS = ("relu", "jumprelu", "batchtopk")  # circuit-tracer 0.5 reads ReLU and JumpReLU (BatchTopK in use is one)
RUN_FOLDER = "transcoders"  # where an `anatomy sae train-transcoders` run keeps its set


def load_transcoders(source: str | os.PathLike, *, dtype: torch.dtype = torch.float32, variant: str | None = None,
                     revision: str | None = None, mlp_out_norm: bool = False, resident: int | None = None
                     ) -> TranscoderSet:
    """A TranscoderSet, in evaluation mode, from a circuit-tracer folder (per-layer or cross-layer), a Gemma
    Scope 2 folder (transcoder_all, or the repository holding it), a training run folder, a Hub id
    `org/name[/folder][@revision]` or a short name of circuit-tracer's ("gemma", "llama"): a path that exists
    wins, then a short name, then a Hub id. Its layers are read when first used (module docstring).

    dtype: the parameters' dtype (files of another are converted layer by layer). variant: Gemma Scope 2's
    width_{W}_l0_{S}[_affine], when the folder holds several. revision: the Hub revision. mlp_out_norm: the
    model normalises its MLP's output (Gemma): circuit-tracer's hook_mlp_out is then that norm's output ("gemma"
    sets it). resident: at most this many layers kept built at once (None: all). Raises ValueError for a bad
    argument and CheckpointError (a ValueError) naming the file or the id for anything wrong with the files
    (missing, malformed, hostile, sizes that disagree, not in the cache while offline), before any tensor is read."""
    from .transcoder_hub import hub_source, resolve

    _check_options(source, dtype, variant, revision, mlp_out_norm, resident)
    path = Path(source).expanduser()
    root = None
    called = ", ".join([repr(str(source))] + [f"{k}={v!r}" for k, v in (("variant", variant), ("revision", revision)) if v])
    command = f'HF_HUB_OFFLINE=0 python -c "import anatomy; anatomy.load_transcoders({called})"'  # fetches what it lacks
    if not _exists(path) and hub_source(str(source)) is not None:
        found = resolve(str(source), variant, revision, command)
        path, root, variant, mlp_out_norm = found.folder, found.root, found.variant, mlp_out_norm or found.mlp_out_norm
    if path.is_dir() and not os.path.lexists(path / CONFIG) and (path / RUN_FOLDER / CONFIG).is_file():
        path = path / RUN_FOLDER
    root = root or path
    options = dict(dtype=dtype, resident=resident)
    if path.is_dir() and os.path.lexists(path / CONFIG):  # a config.yaml that is no regular file is named as such
        return _load_circuit_tracer(path, root, mlp_out_norm, options, command)
    if path.is_dir() and (path / "transcoder_all").is_dir():
        path = path / "transcoder_all"
    if path.is_dir() and any(path.glob("layer_*/params.safetensors")):
        files, variant, about = gemma_scope_2_folder(path, root, variant)
        points = (about.pop("hf_hook_point_in"), about.pop("hf_hook_point_out"))
        return _set(gemma_scope_plans(files), points, about, str(path), **options)
    if not _exists(path):
        raise CheckpointError(f"no transcoder set at {shorten(str(source))!r}: not a folder, a Hub id "
                              "('org/name[/folder]') nor a short name ('gemma', 'llama')")
    raise CheckpointError(f"no transcoder set in {shorten(str(path))!r}: expected {CONFIG} with layer_{{i}}.safetensors "
                          f"or W_enc_{{i}}/W_dec_{{i}}.safetensors (circuit-tracer), transcoder_all/layer_{{i}}_*/"
                          f"params.safetensors (Gemma Scope 2), or a run folder with {RUN_FOLDER}/")


def _check_options(source, dtype, variant, revision, mlp_out_norm, resident) -> None:
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip() or "\0" in str(source):
        raise ValueError(f"source must be a folder, a Hub id or a short name; got {shorten(repr(source), 80)}")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {', '.join(map(str, DTYPES.values()))}; got {shorten(repr(dtype), 80)}")
    for name, value in (("variant", variant), ("revision", revision)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 200 or "\0" in value):
            raise ValueError(f"{name} must be a name or None; got {shorten(repr(value), 80)}")
    if not isinstance(mlp_out_norm, bool):
        raise ValueError(f"mlp_out_norm must be True or False; got {shorten(repr(mlp_out_norm), 80)}")
    if resident is not None and (isinstance(resident, bool) or not isinstance(resident, int) or resident < 1):
        raise ValueError(f"resident must be a positive number of layers or None (all); got {shorten(repr(resident), 80)}")


def _exists(path: Path) -> bool:
    """path.exists(), where a name no file system holds (too long, a NUL byte) is not there."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _set(plans: list[LayerPlan], points: tuple[str, str], metadata: dict, where: str, *, dtype: torch.dtype,
         resident: int | None, cross_layer: bool | None = None) -> TranscoderSet:
    """The TranscoderSet of `plans`, each layer checked to fit in memory in `dtype` (a converted copy's worst
    case), every disagreement between layers a CheckpointError naming `where`."""
    spec = plans[0].spec
    shapes = [(spec.d_in, spec.d_sae), (spec.d_sae, spec.d_out), (2 * spec.d_sae + spec.d_out,)]
    check_tensors_memory(shorten(where), shapes + ([(spec.d_out, spec.d_in)] if spec.skip else []), dtype,
                         "one layer of the transcoder set")
    cross_layer = spec.d_out != spec.d_in if cross_layer is None else cross_layer  # layer 0 of a CLT writes every layer
    try:
        return TranscoderSet(LazyLayers(plans, dtype, resident), cross_layer=cross_layer, input_point=points[0],
                             output_point=points[1], metadata=metadata).eval()
    except ValueError as error:
        raise CheckpointError(f"{shorten(where)!r}: {error}") from None


# ---- circuit-tracer ---------------------------------------------------------------------------------
def _load_circuit_tracer(folder: Path, root: Path, mlp_out_norm: bool, options: dict, command: str) -> TranscoderSet:
    config = read_config(inside(folder / CONFIG, root, "transcoder config"))
    where = str(folder / CONFIG)
    try:
        points = tuple(circuit_tracer_point(config[key], 0, mlp_out_norm).replace(".0.", ".L.", 1)
                       for key in ("feature_input_hook", "feature_output_hook"))
    except ValueError as error:
        raise CheckpointError(f"transcoder config {shorten(where)!r}: {shorten(str(error), 300)}") from None
    metadata = {k: shorten(v, 1000) if isinstance(v, str) else v for k, v in config.items()
                if isinstance(k, str) and isinstance(v, (str, int, float, bool)) and k != "model_kind"}
    metadata = {k: v for k, v in metadata.items() if not isinstance(v, float) or v == v and abs(v) != float("inf")}
    cross_layer = KINDS[config["model_kind"]]
    if cross_layer:
        plans = _clt_plans(folder, root, where)
    elif "transcoders" in config:
        plans = _listed_plans(folder, root, config["transcoders"], where, command)
    else:
        plans = _plt_plans(_numbered(folder, root, "layer_{}.safetensors", where))
    return _set(plans, points, metadata, str(folder), cross_layer=cross_layer, **options)


def _numbered(folder: Path, root: Path, pattern: str, where: str) -> list[Path]:
    """The files pattern.format(0), .format(1), ... of `folder`: every layer from 0, none missing, none twice,
    at most MAX_LAYERS (a file named layer_99999999999 is counted, never a range made up to it)."""
    regex = re.compile(re.escape(pattern).replace(r"\{\}", r"(\d+)"))
    found: dict[int, Path] = {}
    for path in folder.iterdir():
        match = regex.fullmatch(path.name)
        if not match:
            continue
        layer = int(match.group(1))
        if layer in found:
            raise CheckpointError(f"{shorten(where)!r}: {found[layer].name} and {shorten(path.name)} are both layer {layer}")
        found[layer] = path
        if len(found) > MAX_LAYERS:
            raise CheckpointError(f"{shorten(where)!r}: more than {MAX_LAYERS:,} {pattern.format('{i}')} files beside it; "
                                  f"a set has one a layer")
    if not found:
        raise CheckpointError(f"{shorten(where)!r}: no {pattern.format('{i}')} beside it")
    missing = next(i for i in range(len(found) + 1) if i not in found)
    if missing < len(found):
        raise CheckpointError(f"{shorten(where)!r}: {pattern.format(missing)} is missing; a set has one file for every "
                              f"layer 0 .. {len(found) - 1} and no other")
    return [inside(found[i], root, "transcoder file") for i in range(len(found))]


def _plt_plans(files: list[Path]) -> list[LayerPlan]:
    """Per-layer files in circuit-tracer's layout, every header checked against layer 0's."""
    opened = [mapped_file(path) for path in files]
    first = opened[0].shapes
    if len(first.get("W_enc", ())) != 2 or len(first.get("b_dec", ())) != 1:
        raise CheckpointError(f"{shorten(str(files[0]))!r}: a circuit-tracer transcoder holds W_enc [F, E] and b_dec [E]; "
                              f"found {sorted(first)[:8]}")
    (d_sae, d_model), d_out = first["W_enc"], first["b_dec"][0]
    expected = {"W_enc": (d_sae, d_model), "b_enc": (d_sae,), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    optional = {"activation_function.threshold": (d_sae,), "W_skip": (d_out, d_model)}
    present = [k for k in optional if k in first]
    plans = []
    for path, weights in zip(files, opened):
        check_shapes(str(path), weights.shapes, expected, optional)
        if [k for k in optional if k in weights.shapes] != present:
            raise CheckpointError(f"{shorten(str(path))!r} holds {sorted(weights.shapes)}; layer 0 holds {sorted(first)}: "
                                  "every layer of a set has the same tensors")
        kind = "jumprelu" if "activation_function.threshold" in present else "relu"
        spec = LayerSpec(kind, d_model, d_sae, d_out, "W_skip" in present, str(path))
        renamed = {"W_enc": "W_enc", "b_enc": "b_enc", "W_dec": "W_dec", "b_dec": "b_dec",
                   "threshold": "activation_function.threshold", "W_skip": "W_skip"}
        plans.append(LayerPlan(spec, lambda w=weights, names=renamed: {
            ours: (w.tensor(theirs).T if ours == "W_enc" else w.tensor(theirs))  # (F, E) -> (E, F): a view
            for ours, theirs in names.items() if theirs in w.shapes}))
    return plans


def _clt_plans(folder: Path, root: Path, where: str) -> list[LayerPlan]:
    """A cross-layer transcoder in circuit-tracer's lazy layout, every header checked first."""
    encoders = _numbered(folder, root, "W_enc_{}.safetensors", where)
    decoders = _numbered(folder, root, "W_dec_{}.safetensors", where)
    n_layers = len(encoders)
    if len(decoders) != n_layers:
        raise CheckpointError(f"{shorten(where)!r}: {n_layers} W_enc_{{i}} files but {len(decoders)} W_dec_{{i}}; a "
                              "cross-layer set has one of each a layer")
    first = mapped_file(encoders[0]).shapes
    if len(first.get("W_enc_0", ())) != 2:
        raise CheckpointError(f"{shorten(str(encoders[0]))!r}: a cross-layer transcoder's file holds W_enc_0 [F, E]; "
                              f"found {sorted(first)[:8]}")
    d_sae, d_model = first["W_enc_0"]
    thresholded = "threshold_0" in first
    plans = []
    for i, (encoder_file, decoder_file) in enumerate(zip(encoders, decoders)):
        expected = {f"W_enc_{i}": (d_sae, d_model), f"b_enc_{i}": (d_sae,), f"b_dec_{i}": (d_model,)}
        if thresholded:
            expected[f"threshold_{i}"] = (d_sae,)
        encoder, decoder = mapped_file(encoder_file), mapped_file(decoder_file)
        check_shapes(str(encoder_file), encoder.shapes, expected)
        check_shapes(str(decoder_file), decoder.shapes, {f"W_dec_{i}": (d_sae, n_layers - i, d_model)})
        spec = LayerSpec("jumprelu" if thresholded else "relu", d_model, d_sae, (n_layers - i) * d_model, False,
                         f"{encoder_file}, {decoder_file.name}")

        def read(i=i, encoder=encoder, decoder=decoder) -> dict[str, torch.Tensor]:
            tensors = {"W_enc": encoder.tensor(f"W_enc_{i}").T, "b_enc": encoder.tensor(f"b_enc_{i}"),
                       "W_dec": decoder.tensor(f"W_dec_{i}").flatten(1),  # (F, L-i, E) -> (F, (L-i) E): a view
                       "b_dec": first_block(encoder.tensor(f"b_dec_{i}"), n_layers - i)}
            return {**tensors, "threshold": encoder.tensor(f"threshold_{i}")} if thresholded else tensors

        plans.append(LayerPlan(spec, read))
    return plans


def _listed_plans(folder: Path, root: Path, listed: list[str], where: str, command: str) -> list[LayerPlan]:
    """config.yaml's `transcoders`: one file per layer, inside the folder or hf://org/name/path[?revision=r]
    (fetched into the Hugging Face cache), in circuit-tracer's layout, Gemma Scope 2's params.safetensors or
    Gemma Scope's params.npz. command: what fetches them, named when the cache lacks them offline."""
    from .transcoder_hub import fetch_uris

    check_listed(listed, repr(shorten(where)))
    remote = fetch_uris([name for name in listed if name.startswith("hf://")], f"{shorten(where)!r} lists", command)
    files, seen = [], {}
    for layer, name in enumerate(listed):
        if name in remote:
            path, file_root = remote[name]
        elif "://" in name:
            raise CheckpointError(f"{shorten(where)!r} lists {shorten(name)!r}; anatomy reads local files and "
                                  "hf://org/name/path URIs")
        else:
            path, file_root = folder / name, root
        real = inside(path, file_root, "transcoder file")
        if real in seen:
            raise CheckpointError(f"{shorten(where)!r} lists one file twice (layers {seen[real]} and {layer}): "
                                  f"{shorten(name)!r}")
        seen[real] = layer
        files.append(real)
    suffixes = {Path(name.split("?")[0]).suffix for name in listed}
    if ".npz" in suffixes:
        if suffixes != {".npz"}:
            raise CheckpointError(f"{shorten(where)!r} lists .npz and other files; a set is in one layout")
        return gemma_scope_plans(files)
    if "w_enc" in mapped_file(files[0]).shapes:
        return gemma_scope_plans(files)
    return _plt_plans(files)


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
    skip = transcoders.has_skip
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
        (staging / CONFIG).write_text(yaml_module().safe_dump(config, sort_keys=False), encoding="utf-8")
        for path in staging.iterdir():
            os.chmod(path, 0o644)
    return folder
