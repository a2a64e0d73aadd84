"""SAE files: SAELens's folder (cfg.json + sae_weights.safetensors), Gemma Scope's params.npz, Hub ids.

    load_sae("path/to/folder")                            # SAELens 6.x (and older cfg.json spellings)
    load_sae("path/to/params.npz", point="blocks.12.resid_post")   # Gemma Scope: the weights alone
    load_sae("google/gemma-scope-2b-pt-res/layer_12/width_16k/average_l0_82")   # a Hub id + folder
    load_sae("runs/sae")                                  # an `anatomy sae train` run: its sae/ folder
    sae.save("out/")                                      # SAELens's format: SAELens loads it back

A file's hook name (`blocks.12.hook_resid_post`) becomes anatomy's trace point through the
TransformerLens alias table of anatomy/trace.py; `save` writes the TransformerLens name back.

Hostile files get the guarantees of anatomy's checkpoint loader: every size is read from the
headers (safetensors' JSON header, each .npy header inside the zip) and checked against cfg.json,
the other tensors and the memory available before a single tensor is allocated; nothing is ever
unpickled (numpy.load(allow_pickle=False)); every problem is one CheckpointError naming the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from ..checkpoints.files import SAFETENSORS_DTYPES, CheckpointError, read_json, shorten
from ..checkpoints.memory import check_tensors_memory
from ..hook_names import anatomy_name
from .modules import SAE
from .saelens import ARCHITECTURES, CONFIG, WEIGHTS, WITH_SKIP, WRITTEN_KEYS, save_sae

GEMMA_SCOPE = "params.npz"

# Gemma Scope: which point a repository's SAEs read, from its name (google/gemma-scope-2b-pt-res, -mlp, -att,
# -transcoders) and the layer in the folder's path; `flatten`: attention SAEs read hook_z, heads flattened.
GEMMA_SCOPE_POINTS = [
    ("transcoders", "blocks.{L}.mlp_norm.normalized", "blocks.{L}.mlp_out_norm.out", False),  # ln2.hook_normalized -> hook_mlp_out
    ("-res", "blocks.{L}.resid_post", None, False),
    ("-mlp", "blocks.{L}.mlp.out", None, False),
    ("-att", "blocks.{L}.attn.z", None, True),
]


def load_sae(source: str | os.PathLike, *, point: str | None = None, dtype: torch.dtype | None = None,
             revision: str | None = None) -> SAE:
    """An SAE (or transcoder) from a SAELens folder, a Gemma Scope params.npz (or its folder), an
    `anatomy sae train` run folder, or a Hub id `org/name[/path/to/folder]`, in evaluation mode.

    point: the trace point it reads, for files that do not say (params.npz) or to override theirs.
    dtype: the parameters' dtype (default: cfg.json's, else float32). Raises CheckpointError naming
    the file and the problem (missing, malformed, sizes that disagree, more than memory holds, a
    configuration anatomy does not compute), before allocating."""
    path = Path(source)
    if not path.exists() and _looks_like_hub_id(str(source)):
        path = _from_hub(str(source), revision)
    if path.is_dir() and (path / "sae" / CONFIG).is_file() and not (path / CONFIG).is_file():
        path = path / "sae"  # an `anatomy sae train` run folder
    if path.is_file() and path.name == GEMMA_SCOPE:
        return _load_gemma_scope(path, str(source), point, dtype)
    if path.is_dir() and (path / CONFIG).is_file():
        return _load_saelens(path, point, dtype)
    if path.is_dir() and (path / GEMMA_SCOPE).is_file():
        return _load_gemma_scope(path / GEMMA_SCOPE, str(source), point, dtype)
    if not path.exists():
        raise CheckpointError(f"no SAE at {str(source)!r}: not a file, a folder, or a Hub id org/name[/folder]")
    raise CheckpointError(f"no SAE in {str(path)!r}: expected {CONFIG} + {WEIGHTS} (SAELens), {GEMMA_SCOPE} "
                          f"(Gemma Scope), or an `anatomy sae train` run folder")


# ---- SAELens ------------------------------------------------------------------------------------
def _load_saelens(folder: Path, point: str | None, dtype: torch.dtype | None) -> SAE:
    cfg = read_json(folder / CONFIG, "SAE config")
    where = str(folder / CONFIG)
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    architecture = cfg.get("architecture") or _pre_6_architecture(cfg)
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"{where!r}: architecture {shorten(repr(architecture), 80)} is not one anatomy computes; "
                              f"allowed: {', '.join(ARCHITECTURES)}")
    kind, transcoder = ARCHITECTURES[architecture]
    d_in, d_sae = _int(cfg, "d_in", where), _int(cfg, "d_sae", where)
    d_out = _int(cfg, "d_out", where) if transcoder else d_in
    k = _k(cfg, where) if kind == "topk" else None
    normalize = cfg.get("normalize_activations") or "none"
    if normalize != "none":
        raise CheckpointError(f"{where!r}: normalize_activations={shorten(repr(normalize), 80)} rescales inputs with "
                              "statistics the files do not hold; anatomy reads SAEs with 'none' "
                              "(fold the scaling into the weights)")
    for key in ("hook_head_index", "hook_head_index_out"):
        if metadata.get(key, cfg.get(key)) is not None:
            raise CheckpointError(f"{where!r}: {key} reads one head of a point; anatomy's SAEs read whole points")
    reshape = cfg.get("reshape_activations") or "none"
    if reshape not in ("none", "hook_z"):
        raise CheckpointError(f"{where!r}: reshape_activations={shorten(repr(reshape), 80)}; allowed: 'none', 'hook_z'")
    hook = metadata.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point")
    hook_out = metadata.get("hook_name_out") or cfg.get("hook_name_out")
    expected = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    if kind == "jumprelu":
        expected["threshold"] = (d_sae,)
    if architecture in WITH_SKIP:
        expected["W_skip"] = (d_out, d_in)
    tensors = _read_safetensors(folder / WEIGHTS, expected, dtype or _dtype(cfg.get("dtype"), where))
    sae = SAE(d_in, d_sae, kind=kind, k=k, d_out=d_out,
              point=point or (anatomy_name(hook) if hook else None),
              point_out=anatomy_name(hook_out) if transcoder and hook_out else None, transcoder=transcoder,
              apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", not transcoder)),
              flatten_heads=reshape == "hook_z", metadata=_kept_metadata(metadata, cfg), seed=None,
              skip=architecture in WITH_SKIP, dtype=tensors["W_enc"].dtype)
    _assign(sae, tensors)
    if kind == "topk" and cfg.get("rescale_acts_by_decoder_norm"):
        _fold_decoder_norms(sae)
    return sae.eval()


def _pre_6_architecture(cfg: dict) -> str:
    """SAELens < 6 wrote no architecture: activation_fn(_str) 'topk' meant TopK, anything else standard."""
    activation = cfg.get("activation_fn") or cfg.get("activation_fn_str") or "relu"
    return "topk" if activation == "topk" else "standard"


def _k(cfg: dict, where: str) -> int:
    k = cfg.get("k")
    if k is None and isinstance(cfg.get("activation_fn_kwargs"), dict):
        k = cfg["activation_fn_kwargs"].get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg["d_sae"]:
        raise CheckpointError(f"{where!r}: a TopK SAE needs k, an integer in [1, d_sae], got {shorten(repr(k), 80)}")
    return k


def _int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{where!r}: {key} must be a positive integer, got {shorten(repr(value), 80)}")
    return value


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _dtype(name, where: str) -> torch.dtype:
    name = (name or "float32").removeprefix("torch.")
    if name not in DTYPES:
        raise CheckpointError(f"{where!r}: dtype {shorten(repr(name), 80)}; allowed: {', '.join(DTYPES)}")
    return DTYPES[name]


def _kept_metadata(metadata: dict, cfg: dict) -> dict:
    """What a file says beyond the weights, kept (JSON-safe scalars) and written back by save."""
    kept = {k: v for k, v in {**cfg, **metadata}.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return {k: v for k, v in kept.items() if k not in WRITTEN_KEYS}


def _read_safetensors(path: Path, expected: dict[str, tuple[int, ...]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of `path` (read_tensors); a scaling_factor of ones (older SAELens) is dropped."""
    tensors = read_tensors(path, expected, dtype, optional={"scaling_factor": (expected["b_enc"][0],)})
    scaling = tensors.pop("scaling_factor", None)
    if scaling is not None and not torch.equal(scaling, torch.ones_like(scaling)):
        raise CheckpointError(f"{str(path)!r} holds a fine-tuning scaling_factor that is not all ones; anatomy reads "
                              "SAEs whose scaling is folded into W_dec")
    return tensors


def read_tensors(path: Path, expected: dict[str, tuple[int, ...]], dtype: torch.dtype, optional: dict | None = None,
                 what: str = "SAE weights") -> dict[str, torch.Tensor]:
    """{name: tensor in `dtype`} of the safetensors file `path`: every name of `expected` (and of `optional`
    that the file holds), after checking from the header alone that the file holds exactly these names,
    each of the shape given, in floating point, and that they fit in the memory available. Raises
    CheckpointError naming the file and the problem before any tensor is read."""
    try:
        handle = safe_open(str(path), framework="pt")
        shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
        dtypes = {key: handle.get_slice(key).get_dtype() for key in shapes}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{what} {str(path)!r} are missing, corrupt or truncated: {error}") from None
    optional = optional or {}
    check_shapes(str(path), shapes, expected, optional)
    present = list(expected) + [k for k in optional if k in shapes]
    unknown = sorted(k for k in present if SAFETENSORS_DTYPES.get(dtypes[k]) not in DTYPES.values())
    if unknown:
        raise CheckpointError(f"{what} {str(path)!r}: tensors {unknown} are not floating point")
    check_tensors_memory(str(path), [shapes[k] for k in present], dtype, "the SAE")
    try:
        return {k: handle.get_tensor(k).to(dtype) for k in present}
    except Exception as error:  # safetensors reports truncated data only when a tensor is read
        raise CheckpointError(f"{what} {str(path)!r} cannot be read: {error}") from None


def check_shapes(where: str, shapes: dict, expected: dict, optional: dict | None = None) -> None:
    """CheckpointError naming `where` unless `shapes` ({name: shape}) holds every name of `expected`, no name
    beyond it and `optional`, and each with the shape given."""
    optional = optional or {}
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected) - set(optional))
    if missing or extra:
        raise CheckpointError(f"{where!r}: tensors {missing} are missing" if missing else
                              f"{where!r}: unexpected tensors {extra} (expected {sorted(expected)})")
    for key, shape in {**expected, **{k: v for k, v in optional.items() if k in shapes}}.items():
        if tuple(shapes[key]) != tuple(shape):
            raise CheckpointError(f"{where!r}: {key} has shape {tuple(shapes[key])}, the configuration says {shape}")


def _assign(sae: SAE, tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in tensors.items():
            getattr(sae, name).copy_(value)


@torch.no_grad()
def _fold_decoder_norms(sae: SAE) -> None:
    """SAELens's rescale_acts_by_decoder_norm (pre *= |W_dec_i|, f /= |W_dec_i| in decode), folded into the
    weights: W_enc[:, i] *= n_i, b_enc_i *= n_i, W_dec_i /= n_i. The same f and x^, unit decoder rows."""
    norms = sae.W_dec.norm(dim=-1)  # (F,)
    sae.W_enc.mul_(norms)
    sae.b_enc.mul_(norms)
    sae.W_dec.div_(norms[:, None])


# ---- Gemma Scope --------------------------------------------------------------------------------
def _load_gemma_scope(path: Path, source: str, point: str | None, dtype: torch.dtype | None) -> SAE:
    """params.npz: W_enc [E, F], W_dec [F, O], b_enc, b_dec, threshold; a JumpReLU that never subtracts b_dec
    from its input. The point comes from `point` or the repository name and the folder's layer_N. The
    archive's directory and headers are checked first (mapped.py: no object array, no zip bomb)."""
    from .mapped import check_finite, mapped_file

    weights = mapped_file(path)
    shapes = weights.shapes
    if "W_enc" not in shapes or len(shapes["W_enc"]) != 2 or "W_dec" not in shapes or len(shapes["W_dec"]) != 2:
        raise CheckpointError(f"{str(path)!r}: a Gemma Scope file holds W_enc and W_dec matrices; found {sorted(shapes)}")
    (d_in, d_sae), d_out = shapes["W_enc"], shapes["W_dec"][-1]
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_enc": (d_sae,), "b_dec": (d_out,),
                "threshold": (d_sae,)}
    check_shapes(str(path), shapes, expected)
    dtype = dtype or torch.float32
    check_tensors_memory(str(path), list(expected.values()), dtype, "the SAE")
    where, point_out, flatten = _gemma_scope_point(source, point)
    transcoder = point_out is not None or d_out != d_in
    sae = SAE(d_in, d_sae, kind="jumprelu", d_out=d_out, point=where, point_out=point_out, transcoder=transcoder,
              apply_b_dec_to_input=False, flatten_heads=flatten, metadata={"source": source}, dtype=dtype, seed=None)
    tensors = {key: weights.tensor(key) for key in expected}
    for key, tensor in tensors.items():
        check_finite(tensor, f"{str(path)!r}: {key}")
    _assign(sae, {key: tensor.to(dtype) for key, tensor in tensors.items()})
    return sae.eval()


def _gemma_scope_point(source: str, point: str | None) -> tuple[str | None, str | None, bool]:
    """(point read, point written for a transcoder, flatten heads) from `point` or the path's names: the
    repository's (its last component named gemma-scope*, never a folder above it) and layer_N below it."""
    parts = Path(source).parts
    at = max((i for i, part in enumerate(parts) if part.startswith("gemma-scope")), default=None)
    repository = parts[at] if at is not None else ""
    layer = re.search(r"layer_(\d+)", "/".join(parts[at + 1:])) if at is not None else None
    for marker, reads, writes, flatten in GEMMA_SCOPE_POINTS:
        if marker in repository and layer:
            n = layer.group(1)
            return (anatomy_name(point) if point else reads.format(L=n)), writes and writes.format(L=n), flatten
    return (anatomy_name(point) if point else None), None, False


# ---- the Hub ------------------------------------------------------------------------------------
def _looks_like_hub_id(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(/[\w.=-]+)*", text))


def _from_hub(source: str, revision: str | None) -> Path:
    """The local folder of `org/name/path/to/folder` (only its SAE files downloaded)."""
    from ..checkpoints.hub import fetch

    org, name, *inside = source.split("/")
    folder = "/".join(inside)
    prefix = f"{folder}/" if folder else ""
    snapshot = fetch(f"{org}/{name}", [prefix + f for f in (CONFIG, WEIGHTS, GEMMA_SCOPE)], revision)
    return snapshot / folder if folder else snapshot


__all__ = ["check_shapes", "load_sae", "read_tensors", "save_sae"]  # save_sae: saelens.py's, here too
