"""Small transcoder files in each layout the field publishes, and a Hugging Face cache to put them in.

    params_npz(...)        Gemma Scope's params.npz (W_enc [E, F], ...; optionally affine_skip_connection)
    params_safetensors()   Gemma Scope 2's params.safetensors (w_enc [E, F], ...)
    layer_safetensors()    circuit-tracer's layer_{i}.safetensors (W_enc [F, E], ...; optionally W_skip)
    fake_repo(cache, "org/name", {path: bytes})    a repository as huggingface_hub caches it: blobs named by
                                                   their hash, snapshots/<commit>/<path> linking to them, refs/main

Every array is random (seeded) and every file is made by the test that uses it: no blob is stored.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def arrays(d_model: int, d_sae: int, seed: int, skip: bool = False) -> dict[str, np.ndarray]:
    """Gemma Scope's arrays (x W_enc, thresholds that leave some features active), float32."""
    rng = np.random.default_rng(seed)
    found = {"W_enc": rng.normal(size=(d_model, d_sae)), "W_dec": rng.normal(size=(d_sae, d_model)),
             "b_enc": rng.normal(size=d_sae) * 0.1, "b_dec": rng.normal(size=d_model) * 0.1,
             "threshold": rng.uniform(0.0, 0.5, size=d_sae)}
    if skip:
        found["affine_skip_connection"] = rng.normal(size=(d_model, d_model)) * 0.1
    return {name: value.astype(np.float32) for name, value in found.items()}


def params_npz(values: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **values)
    return buffer.getvalue()


def params_safetensors(values: dict[str, np.ndarray]) -> bytes:
    """Gemma Scope 2's spelling: the same arrays, lowercase names."""
    return save({name.lower(): torch.from_numpy(value) for name, value in values.items()})


def layer_safetensors(values: dict[str, np.ndarray]) -> bytes:
    """circuit-tracer's spelling of the same transcoder: W_enc [F, E], the threshold inside its activation,
    the skip as W_skip [E_out, E_in]."""
    tensors = {"W_enc": values["W_enc"].T.copy(), "b_enc": values["b_enc"], "W_dec": values["W_dec"],
               "b_dec": values["b_dec"], "activation_function.threshold": values["threshold"]}
    if "affine_skip_connection" in values:
        tensors["W_skip"] = values["affine_skip_connection"].T.copy()
    return save({name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in tensors.items()})


def fake_repo(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """`files` as huggingface_hub caches a repository (module docstring); returns the snapshot folder."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        depth = len(Path(name).parts) + 1  # up from the link's folder to the repository's
        link.symlink_to(Path(*[".."] * depth) / "blobs" / blob.name)
    return snapshot


def expected_features(values: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """A JumpReLU transcoder's features, in float64, from the arrays alone: pre where pre > threshold."""
    pre = x.astype(np.float64) @ values["W_enc"] + values["b_enc"]
    return np.where(pre > values["threshold"], pre, 0.0)


def expected_output(values: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Its reconstruction: f W_dec + b_dec (+ x A for an affine skip)."""
    out = expected_features(values, x) @ values["W_dec"] + values["b_dec"]
    return out + x @ values["affine_skip_connection"] if "affine_skip_connection" in values else out
