"""Gemma Scope's transcoders, one file a layer: params.npz (Gemma Scope, gemma-2) and params.safetensors
(Gemma Scope 2, gemma-3), as layers of a TranscoderSet read when first used (transcoder_layers.py).

Shape letters: E d_model, F features, L n_layers.

    params.npz / params.safetensors    W_enc | w_enc [E, F] (read as x w_enc), W_dec | w_dec [F, E] (a CLT's
                                       [F, L, E]: layer i keeps its rows for layers i .. L - 1), b_enc [F],
                                       b_dec [E], threshold [F] (JumpReLU), and for an affine-skip set
                                       affine_skip_connection [E, E] (x A)

Gemma Scope 2's folders, transcoder_all/layer_{i}_{variant}/params.safetensors, come with a config.json
naming the points as Hugging Face module outputs (pre_feedforward_layernorm -> post_feedforward_layernorm:
Gemma 3's sandwich norms), read here; a set listed in circuit-tracer's config.yaml names its own points.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..checkpoints.files import CheckpointError, inside, read_json, shorten
from ..hook_names import hf_module_point
from .formats import check_shapes
from .mapped import mapped_file
from .transcoder_config import MAX_LAYERS
from .transcoder_layers import LayerPlan, LayerSpec, first_block

PARAMS = "params.safetensors"
DEFAULT_POINTS = {"hf_hook_point_in": "blocks.L.mlp_norm.out", "hf_hook_point_out": "blocks.L.mlp_out_norm.out"}


def gemma_scope_plans(files: list[Path]) -> list[LayerPlan]:
    """One plan a layer from Gemma Scope files (module docstring), every header checked against layer 0's."""
    opened = [mapped_file(path) for path in files]
    first = _lowercased(opened[0])
    if len(first.get("w_enc", ())) != 2 or len(first.get("w_dec", ())) not in (2, 3):
        raise CheckpointError(f"{shorten(str(files[0]))!r}: a Gemma Scope transcoder holds w_enc [E, F] and w_dec "
                              f"[F, E] or [F, L, E]; found {sorted(first)[:8]}")
    (d_model, d_sae), n_layers = first["w_enc"], len(files)
    cross_layer = len(first["w_dec"]) == 3
    w_dec = (d_sae, n_layers, d_model) if cross_layer else (d_sae, d_model)
    expected = {"w_enc": (d_model, d_sae), "w_dec": w_dec, "b_enc": (d_sae,), "b_dec": (d_model,), "threshold": (d_sae,)}
    optional = {"affine_skip_connection": (d_model, d_model)}
    plans = []
    for layer, (path, weights) in enumerate(zip(files, opened)):
        shapes = _lowercased(weights)
        check_shapes(str(path), shapes, expected, optional)
        if ("affine_skip_connection" in shapes) != ("affine_skip_connection" in first):
            raise CheckpointError(f"{shorten(str(path))!r}: every layer of a set has an affine_skip_connection, or none does")
        blocks = n_layers - layer if cross_layer else 1
        spec = LayerSpec("jumprelu", d_model, d_sae, blocks * d_model, "affine_skip_connection" in shapes, str(path))
        plans.append(LayerPlan(spec, _reader(weights, layer, blocks, cross_layer)))
    return plans


def _lowercased(weights) -> dict[str, tuple[int, ...]]:
    """{name: shape} with Gemma Scope's two spellings (W_enc in npz, w_enc in safetensors) made one; a file
    holding both spellings of a name is refused."""
    shapes = {}
    for name, shape in weights.shapes.items():
        if name.lower() in shapes:
            raise CheckpointError(f"{weights.where} holds {shorten(name)!r} in two spellings")
        shapes[name.lower()] = shape
    return shapes


def _reader(weights, layer: int, blocks: int, cross_layer: bool):
    """read() for one layer: anatomy's layout from Gemma Scope's (a view of the mapped file, but for a CLT's
    later layers, whose rows are not contiguous)."""
    names = {name.lower(): name for name in weights.shapes}

    def read() -> dict[str, torch.Tensor]:
        t = {key: weights.tensor(name) for key, name in names.items()}
        decoder, bias, skip = t["w_dec"], t["b_dec"], t.get("affine_skip_connection")
        if cross_layer:
            decoder = decoder[:, layer:].flatten(1)  # (F, L - i, E) -> (F, (L - i) E): the rows to layers i and later
            bias = first_block(bias, blocks)
        if skip is not None:  # x A = x (A^T)^T: W_skip [E_out, E_in], zero beyond a CLT layer's own output
            skip = skip.T if blocks == 1 else torch.cat([skip.T, skip.new_zeros((blocks - 1) * skip.size(0), skip.size(1))])
        tensors = {"W_enc": t["w_enc"], "b_enc": t["b_enc"], "W_dec": decoder, "b_dec": bias, "threshold": t["threshold"]}
        return tensors if skip is None else {**tensors, "W_skip": skip}

    return read


def gemma_scope_2_folder(folder: Path, root: Path, variant: str | None) -> tuple[list[Path], str, dict]:
    """(params.safetensors of every layer, the variant, config.json's points and model name) of a Gemma Scope 2
    folder transcoder_all/layer_{i}_{variant}/, every file inside `root`. CheckpointError naming the variants when none is chosen and
    there are several, or naming the first layer missing."""
    by_variant: dict[str, dict[int, Path]] = {}
    for count, params in enumerate(folder.glob(f"layer_*/{PARAMS}")):
        if count >= 64 * MAX_LAYERS:
            raise CheckpointError(f"{shorten(str(folder))!r} holds more than {64 * MAX_LAYERS:,} layer folders")
        match = re.fullmatch(r"layer_(\d+)_(.{1,200})", params.parent.name)
        if match:
            by_variant.setdefault(match.group(2), {})[int(match.group(1))] = params
    where = repr(shorten(str(folder)))
    allowed = ", ".join(shorten(v, 80) for v in sorted(by_variant)[:20])
    if variant is None and len(by_variant) != 1:
        raise CheckpointError(f"{where} holds Gemma Scope 2 transcoders of several variants; choose one: {allowed}")
    variant = variant if variant is not None else next(iter(by_variant))
    if variant not in by_variant:
        raise CheckpointError(f"{where} has no Gemma Scope 2 variant {shorten(repr(variant), 80)}; allowed: {allowed}")
    layers = by_variant[variant]
    if len(layers) > MAX_LAYERS:
        raise CheckpointError(f"{where} holds {len(layers):,} layers of {variant!r}; a set has at most {MAX_LAYERS:,}")
    missing = next(i for i in range(len(layers) + 1) if i not in layers)
    if missing < len(layers):
        raise CheckpointError(f"{where}: layer_{missing}_{shorten(variant, 80)} is missing; a set has every layer "
                              f"0 .. {len(layers) - 1} and no other")
    files = [inside(layers[i], root, "Gemma Scope 2 file") for i in range(len(layers))]
    config_file = layers[0].parent / "config.json"
    config = read_json(inside(config_file, root, "Gemma Scope 2 config"), "Gemma Scope 2 config") \
        if config_file.is_file() else {}
    points = {}
    for key, default in DEFAULT_POINTS.items():
        name = config.get(key)
        try:
            points[key] = re.sub(r"^blocks\.\d+\.", "blocks.L.", hf_module_point(name)) if isinstance(name, str) else default
        except ValueError as error:
            raise CheckpointError(f"{shorten(str(config_file))!r}: {key}: {shorten(str(error), 200)}") from None
    about = {"scan": f"{folder.parent.name}/{folder.name}/{variant}"}
    if isinstance(config.get("model_name"), str):
        about["model_name"] = shorten(config["model_name"], 200)
    return files, variant, {**about, **points}
