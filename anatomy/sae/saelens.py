"""SAELens's layout of an SAE folder: cfg.json and sae_weights.safetensors, the architecture names both
ways, and the writer (`save_sae`, `SAE.save`); formats.py reads the folder back.

This module reads an SAE's fields and never imports the SAE class (modules.py), so that `SAE.save` can
call it without an import circle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors.torch import save_file

from ..checkpoints.writing import replacing, write_atomically
from ..hook_names import transformer_lens_name

if TYPE_CHECKING:
    from .modules import SAE

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
FORMAT_VERSION = "6.0.0"  # the SAELens cfg.json layout written here (hook names under "metadata")

# SAELens architecture <-> (anatomy kind, transcoder). batchtopk is written as SAELens writes it: a
# JumpReLU with the learned threshold. topk_transcoder is anatomy's own (SAELens has no TopK transcoder).
ARCHITECTURES = {
    "standard": ("relu", False),
    "topk": ("topk", False),
    "jumprelu": ("jumprelu", False),
    "transcoder": ("relu", True),
    "jumprelu_transcoder": ("jumprelu", True),
    "topk_transcoder": ("topk", True),
    "skip_transcoder": ("relu", True),
    "jumprelu_skip_transcoder": ("jumprelu", True),
    "topk_skip_transcoder": ("topk", True),
}
WITH_SKIP = {"skip_transcoder", "jumprelu_skip_transcoder", "topk_skip_transcoder"}  # W_skip [d_out, d_in]
WRITTEN_AS = {(kind, transcoder, name in WITH_SKIP): name for name, (kind, transcoder) in ARCHITECTURES.items()}
for _skip in (False, True):
    WRITTEN_AS[("batchtopk", True, _skip)] = WRITTEN_AS[("jumprelu", True, _skip)]
WRITTEN_AS[("batchtopk", False, False)] = "jumprelu"
# the keys cfg.json's writer sets itself; a loaded file's other keys are kept as metadata (formats.py)
WRITTEN_KEYS = {"d_in", "d_sae", "d_out", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
                "reshape_activations", "metadata", "architecture", "k", "rescale_acts_by_decoder_norm",
                "hook_name", "hook_name_out", "sae_lens_version", "sae_lens_training_version"}


def saelens_config(sae: SAE) -> dict:
    """The cfg.json SAELens 6.x writes for this SAE (hook names in TransformerLens spelling)."""
    metadata = {**sae.metadata, "sae_lens_version": FORMAT_VERSION, "sae_lens_training_version": FORMAT_VERSION}
    if sae.point:
        metadata["hook_name"] = transformer_lens_name(sae.point)
    if sae.point_out:
        metadata["hook_name_out"] = transformer_lens_name(sae.point_out)
    config = {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": str(sae.W_enc.dtype).removeprefix("torch."),
              "device": "cpu", "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
              "reshape_activations": "hook_z" if sae.flatten_heads else "none", "metadata": metadata}
    if sae.is_transcoder:
        config["d_out"] = sae.d_out
    if sae.kind == "topk":
        config.update(k=sae.k, rescale_acts_by_decoder_norm=False)
    config["architecture"] = WRITTEN_AS[(sae.kind, sae.is_transcoder, sae.W_skip is not None)]
    return config


def save_sae(sae: SAE, folder: str | os.PathLike) -> Path:
    """Write `sae` to `folder` as SAELens writes one: cfg.json and sae_weights.safetensors (W_enc, b_enc,
    W_dec, b_dec, and threshold for a JumpReLU or BatchTopK), each file atomically, mode 0644."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = ["W_enc", "b_enc", "W_dec", "b_dec"] + (["threshold"] if sae.kind in ("jumprelu", "batchtopk") else []) \
        + (["W_skip"] if sae.W_skip is not None else [])
    tensors = {name: getattr(sae, name).detach().cpu().contiguous().clone() for name in names}
    with replacing(folder / WEIGHTS, durable=True) as temporary:
        save_file(tensors, str(temporary))
    write_atomically(folder / CONFIG, json.dumps(saelens_config(sae), indent=1) + "\n", durable=True)
    return folder
