"""Checks on what a caller passes to a model, made before any computation.

Each error names the argument, what was wrong, and what is allowed. Nothing is broadcast
silently: a mask must have exactly the shape of the ids it describes.
"""

from __future__ import annotations

import torch

from .text import InputError  # one error for a bad tensor and a bad text


# The dtypes torch's embedding lookup takes as indices. Ids of another dtype (uint8, int16, ...)
# are refused by name rather than copied behind the caller's back.
ID_DTYPES = (torch.long, torch.int32)


def check_ids(name: str, ids, *, vocab_size: int, max_positions: int | None, past_length: int = 0) -> torch.Tensor:
    """ids must be a tensor [B, T] of dtype torch.long or torch.int32, B >= 1, T >= 1, every value in
    [0, vocab_size)."""
    if not torch.is_tensor(ids):
        raise InputError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in ID_DTYPES:
        raise InputError(f"{name} must hold integer token ids of dtype torch.long (or torch.int32), got dtype "
                         f"{ids.dtype}; convert with `{name}.long()`")
    if ids.dim() != 2:
        raise InputError(f"{name} must have shape [batch, seq_len], got shape {tuple(ids.shape)}")
    batch, length = ids.shape
    if batch == 0 or length == 0:
        raise InputError(f"{name} is empty (shape {tuple(ids.shape)}); need at least one sequence of one token")
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise InputError(f"{name} contains the negative id {low}; ids must be in [0, vocab_size={vocab_size})")
    if high >= vocab_size:
        raise InputError(f"{name} contains id {high}, outside [0, vocab_size={vocab_size})")
    if max_positions is not None and past_length + length > max_positions:
        raise InputError(
            f"{name} has {length} positions" + (f" after {past_length} cached ones" if past_length else "")
            + f"; the model's positions support at most max_seq_len={max_positions}"
        )
    return ids


def check_mask(name: str, mask, *, shape: tuple[int, int], ids_name: str) -> torch.Tensor | None:
    """A padding mask must be a bool tensor of exactly `shape` (True = real token)."""
    if mask is None:
        return None
    if not torch.is_tensor(mask):
        raise InputError(f"{name} must be a torch.Tensor of dtype bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise InputError(
            f"{name} must have dtype torch.bool (True = real token, False = padding), got {mask.dtype}; "
            f"convert with `{name}.bool()` if it holds 1/0"
        )
    if tuple(mask.shape) != tuple(shape):
        raise InputError(
            f"{name} has shape {tuple(mask.shape)} but must be {tuple(shape)} [batch, positions] to match "
            f"{ids_name}; masks are never broadcast"
        )
    return mask


def check_token_types(token_type_ids, *, shape: tuple[int, int], type_vocab_size: int) -> torch.Tensor | None:
    if token_type_ids is None:
        return None
    if type_vocab_size == 0:
        raise InputError("token_type_ids were given but this model has no token-type embeddings (type_vocab_size=0)")
    check_ids("token_type_ids", token_type_ids, vocab_size=type_vocab_size, max_positions=None)
    if tuple(token_type_ids.shape) != tuple(shape):
        raise InputError(f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids has {tuple(shape)}")
    return token_type_ids


def pad_batch(rows, pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of different lengths -> (ids [B, T] long, padding_mask [B, T] bool, True = real token).

    T is the longest row (at least 1); shorter rows are filled with `pad_id` on the right (training,
    encoders) or on the left (a decoder's prompts, so that every row's last token is its newest).
    """
    if side not in ("right", "left"):
        raise ValueError(f"padding side must be 'right' or 'left', got {side!r}")
    rows = [torch.as_tensor(row, dtype=torch.long, device="cpu").reshape(-1) for row in rows]
    length = max([1] + [len(row) for row in rows])
    # made on the CPU, a row at a time (a copy each on a GPU); the model's device takes the whole batch at once
    ids = torch.full((len(rows), length), int(pad_id), dtype=torch.long, device="cpu")  # (B, T)
    mask = torch.zeros((len(rows), length), dtype=torch.bool, device="cpu")  # (B, T)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(length - len(row), length)
        ids[i, span] = row
        mask[i, span] = True
    return ids, mask
