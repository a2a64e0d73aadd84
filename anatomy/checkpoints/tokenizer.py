"""Tokenizers (through the HF `tokenizers` library, never hand-written) and sentence embeddings."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from .files import CheckpointError, resolve


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer as a `tokenizers.Tokenizer`, padding each batch to its longest
    sequence and truncating to the model's maximum length.

    Read from tokenizer.json; otherwise from vocab.txt (BERT WordPiece, lower-cased if
    tokenizer_config.json says so) or vocab.json + merges.txt (GPT-2 byte-level BPE).
    Raises CheckpointError when the directory has none of these.
    """
    from tokenizers import Tokenizer

    directory = resolve(path)
    settings = {}
    if (directory / "tokenizer_config.json").is_file():
        settings = json.loads((directory / "tokenizer_config.json").read_text())
    if (directory / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    elif (directory / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        tokenizer = Tokenizer.from_str(BertWordPieceTokenizer(
            str(directory / "vocab.txt"), lowercase=settings.get("do_lower_case", True),
            strip_accents=settings.get("strip_accents"),
        ).to_str())
    elif (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        from tokenizers.implementations import ByteLevelBPETokenizer

        tokenizer = Tokenizer.from_str(ByteLevelBPETokenizer(
            str(directory / "vocab.json"), str(directory / "merges.txt")
        ).to_str())
    else:
        raise CheckpointError(
            f"no tokenizer in {str(directory)!r}: expected tokenizer.json, vocab.txt (WordPiece) "
            "or vocab.json + merges.txt (byte-level BPE)"
        )
    pad_token = settings.get("pad_token") if isinstance(settings.get("pad_token"), str) else None
    pad_id = tokenizer.token_to_id(pad_token) if pad_token else None
    if pad_id is None:
        padding = tokenizer.padding or {}
        pad_id, pad_token = padding.get("pad_id", 0), padding.get("pad_token", "[PAD]")
    # The file may pin a fixed length (MiniLM's pads everything to 128): pad to the batch's longest.
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    max_length = settings.get("model_max_length")
    if isinstance(max_length, int) and max_length < 1_000_000:
        tokenizer.enable_truncation(max_length)
    else:
        tokenizer.no_truncation()
    return tokenizer


def sentence_embeddings(model, tokenizer, sentences: str | Sequence[str], *, batch_size: int = 32,
                        max_length: int | None = None) -> torch.Tensor:
    """One vector per sentence, as sentence-transformers computes it: [N, d_model].

        e = sum_t m_t h_t / sum_t m_t      (mean over real tokens; m = padding mask)
        e = e / ||e||_2                     (when the model's folder has a Normalize module)

    Pooling ("mean", "cls" or "max"), normalisation and the maximum length come from the
    checkpoint's modules.json, 1_Pooling/config.json and sentence_bert_config.json.
    """
    from tokenizers import Tokenizer

    if isinstance(sentences, str):
        sentences = [sentences]
    settings = model.config.extra.get("sentence_transformers") or {"pooling": "mean", "normalize": True}
    max_length = max_length or settings.get("max_seq_length") or model.config.max_seq_len
    tok = Tokenizer.from_str(tokenizer.to_str())  # a copy: the caller's settings stay as they are
    padding = tokenizer.padding or {}
    tok.enable_padding(pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]"))
    tok.enable_truncation(max_length)
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            batch = tok.encode_batch(list(sentences[start:start + batch_size]))
            ids = torch.tensor([e.ids for e in batch], device=device)  # (B, T)
            mask = torch.tensor([e.attention_mask for e in batch], device=device).bool()  # (B, T)
            types = torch.tensor([e.type_ids for e in batch], device=device)
            kwargs = {"token_type_ids": types} if model.config.type_vocab_size else {}
            hidden = model(ids, padding_mask=mask, **kwargs).last_hidden_state.float()  # (B, T, E)
            out.append(_pool(hidden, mask, settings["pooling"]))
    embeddings = torch.cat(out)
    return F.normalize(embeddings, p=2, dim=-1) if settings.get("normalize") else embeddings


def _pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    if how == "cls":
        return hidden[:, 0]
    if how == "max":
        return hidden.masked_fill(~mask[:, :, None], torch.finfo(hidden.dtype).min).max(dim=1).values
    weights = mask.to(hidden.dtype)[:, :, None]  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
