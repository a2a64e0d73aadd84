"""Sentence embeddings as sentence-transformers computes them, from a sentence-transformers folder.

    modules.json                 the pipeline: Transformer -> Pooling (-> Normalize)
    1_Pooling/config.json        which pooling: cls_token, mean_tokens or max_tokens
    sentence_bert_config.json    max_seq_length
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..inputs import pad_batch
from ..models import pool
from .files import CheckpointError, read_json
from .tokenizer import Tokenizer

# sentence-transformers' pooling mode -> anatomy.models.pool's name for it
POOLING_MODES = {"cls_token": "first", "mean_tokens": "mean", "max_tokens": "max"}


def sentence_transformers_config(directory: Path) -> dict | None:
    """Pooling, normalisation and maximum length of a sentence-transformers folder; None if it is not one.

    Raises CheckpointError naming the file when modules.json or a module's config is malformed."""
    path = directory / "modules.json"
    if not path.is_file():
        return None
    modules = read_json(path, "sentence-transformers modules list", kind=list)
    out = {"pooling": "mean", "normalize": False, "max_seq_length": None}
    for module in modules:
        if not isinstance(module, dict) or not isinstance(module.get("type", ""), str):
            raise CheckpointError(f"{str(path)!r}: every entry must be an object with a string 'type', got {module!r:.80}")
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Pooling":
            folder = module.get("path")
            if not isinstance(folder, str) or not (directory / folder).resolve().is_relative_to(directory.resolve()):
                raise CheckpointError(f"{str(path)!r}: the Pooling module's 'path' must be a folder inside the checkpoint")
            pooling = read_json(directory / folder / "config.json", "pooling config")
            modes = [m for m in POOLING_MODES if pooling.get(f"pooling_mode_{m}")]
            if len(modes) != 1:
                raise CheckpointError(f"pooling config asks for {modes or 'no mode'}; anatomy supports exactly one of "
                                      f"{', '.join(POOLING_MODES)}")
            out["pooling"] = POOLING_MODES[modes[0]]
        elif kind == "Normalize":
            out["normalize"] = True
    if (directory / "sentence_bert_config.json").is_file():
        length = read_json(directory / "sentence_bert_config.json", "sentence-transformers config").get("max_seq_length")
        out["max_seq_length"] = length if isinstance(length, int) and length > 0 else None
    return out


def sentence_embeddings(model, tokenizer: Tokenizer, sentences: str | Sequence[str], *, batch_size: int = 32,
                        max_length: int | None = None) -> torch.Tensor:
    """One vector per sentence, as sentence-transformers computes it: [N, d_model].

        e = sum_t m_t h_t / sum_t m_t      (mean over real tokens; m = padding mask)
        e = e / ||e||_2                     (when the model's folder has a Normalize module)

    Pooling ("mean", "first" or "max"), normalisation and the maximum length come from the
    checkpoint's modules.json, 1_Pooling/config.json and sentence_bert_config.json.
    """
    if isinstance(sentences, str):
        sentences = [sentences]
    settings = model.config.extra.get("sentence_transformers") or {"pooling": "mean", "normalize": True}
    max_length = max_length or settings.get("max_seq_length") or model.config.max_seq_len
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            rows = tokenizer.encode_batch(list(sentences[start:start + batch_size]), max_length=max_length)
            pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
            ids, mask = (t.to(device) for t in pad_batch(rows, pad))  # (B, T), (B, T)
            kwargs = {"token_type_ids": torch.zeros_like(ids)} if model.config.type_vocab_size else {}
            hidden = model(ids, padding_mask=mask, **kwargs).last_hidden_state.float()  # (B, T, E)
            out.append(pool(hidden, mask, settings["pooling"]))
    embeddings = torch.cat(out)
    return F.normalize(embeddings, p=2, dim=-1) if settings.get("normalize") else embeddings
