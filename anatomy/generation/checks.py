"""Every argument of `generate`, checked before any computation or allocation.

Each error is a ValueError (TypeError for a model without an LM head) that names the argument,
the value given and the values allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..checkpoints.memory import available_memory as machine_memory
from ..models import DecoderModel, EncoderDecoderModel
from .choices import MAX_LENGTH_PENALTY, STRATEGIES
from .runner import context_window

ID_DTYPES = (torch.int64, torch.int32)  # what an embedding lookup takes


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _token_id(name: str, value, vocab_size: int) -> None:
    if not _is_int(value) or not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be a token id in [0, vocab_size={vocab_size}), got {value!r}")


def _ids(name: str, ids, vocab_size: int) -> None:
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype not in ID_DTYPES:
        got = f"shape {tuple(ids.shape)}, dtype {ids.dtype}" if torch.is_tensor(ids) else type(ids).__name__
        raise ValueError(f"{name} must be a tensor of token ids [batch, positions] with dtype torch.long "
                         f"(or torch.int32), got {got}")
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}): give at least one token per row")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} holds id {low if low < 0 else high}, outside [0, vocab_size={vocab_size})")


def stop_ids(stop_tokens: int | Iterable[int] | None, vocab_size: int) -> list[int]:
    """None, an id, or ids (a list, tuple or 1-D integer tensor) -> a list of ids, each checked."""
    if stop_tokens is None:
        return []
    if torch.is_tensor(stop_tokens):
        if stop_tokens.dim() > 1 or stop_tokens.dtype.is_floating_point or stop_tokens.dtype == torch.bool:
            raise ValueError(f"stop_tokens must be an id or ids, got a {stop_tokens.dtype} tensor of shape "
                             f"{tuple(stop_tokens.shape)}")
        stop_tokens = stop_tokens.tolist()
    if _is_int(stop_tokens):
        stop_tokens = [stop_tokens]
    if isinstance(stop_tokens, (str, bytes)) or not isinstance(stop_tokens, Iterable):
        raise ValueError(f"stop_tokens must be a token id or a list of token ids, got {stop_tokens!r}")
    stops = list(stop_tokens)
    for token in stops:
        _token_id("each of stop_tokens", token, vocab_size)
    return stops


def check_arguments(model, input_ids, padding_mask, src_ids, src_padding_mask, *, strategy, max_new_tokens,
                    temperature, top_k, top_p, num_beams, length_penalty, pad_token_id, decoder_start_token_id,
                    use_cache, streamer, seed, generator) -> None:
    """Every ValueError names the argument and the values it may take."""
    if not isinstance(model, (DecoderModel, EncoderDecoderModel)):
        raise TypeError(
            f"generate needs a DecoderModel or an EncoderDecoderModel (a model with an LM head), "
            f"got {type(model).__name__}"
        )
    if isinstance(model, DecoderModel) and not hasattr(model, "lm_head"):
        raise ValueError("this DecoderModel has head='none': generation needs head='lm'")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not supported; allowed values: {', '.join(map(repr, STRATEGIES))}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_int(num_beams) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if strategy != "beam" and num_beams != 1:
        raise ValueError(f"num_beams={num_beams} needs strategy='beam' (strategy is {strategy!r})")
    # length^alpha: an |alpha| beyond 10 has no use, and a huge integer alpha makes Python's exact
    # integer power run for hours
    _finite("length_penalty", length_penalty)
    if not -MAX_LENGTH_PENALTY <= length_penalty <= MAX_LENGTH_PENALTY:
        raise ValueError(f"length_penalty must be in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}], got {length_penalty!r}")
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be True or False, got {use_cache!r}")
    if strategy == "sample":
        _finite("temperature", temperature)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature!r} (use strategy='greedy' "
                             "for the limit temperature -> 0)")
        if top_k is not None and (not _is_int(top_k) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
        if seed is not None and generator is not None:
            raise ValueError("give either seed or generator, not both")
        if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    else:
        given = [f"{name}={value!r}" for name, value, default in
                 (("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None),
                  ("seed", seed, None), ("generator", generator, None)) if value != default]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to strategy='sample' (strategy is {strategy!r})")
    if strategy == "beam" and streamer is not None:
        raise ValueError("streaming needs strategy 'greedy' or 'sample': a beam's tokens can still change")
    if streamer is not None and not callable(streamer):
        raise ValueError(f"streamer must be a function of the list of new tokens, got {type(streamer).__name__}")
    vocab_size = model.config.vocab_size
    if pad_token_id is not None:
        _token_id("pad_token_id", pad_token_id, vocab_size)
    if decoder_start_token_id is not None:
        _token_id("decoder_start_token_id", decoder_start_token_id, vocab_size)
    if isinstance(model, EncoderDecoderModel):
        if src_ids is None:
            raise ValueError("an encoder-decoder model needs src_ids (the source sequence) [B, S]")
        _ids("src_ids", src_ids, vocab_size)
        if padding_mask is not None:
            raise ValueError("padding_mask is for left-padded decoder-only prompts; an encoder-decoder batch "
                             "pads its sources instead (src_padding_mask)")
        _mask("src_padding_mask", src_padding_mask, src_ids)
        if torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.size(0) != src_ids.size(0):
            raise ValueError(f"input_ids has {input_ids.size(0)} rows and src_ids {src_ids.size(0)}: one prefix "
                             "per source")
    else:
        if src_ids is not None or src_padding_mask is not None:
            raise ValueError("src_ids are for encoder-decoder models; a decoder-only model takes input_ids")
        if input_ids is None:
            raise ValueError("a decoder-only model needs input_ids (the prompt) [B, T]")
    if input_ids is not None:
        _ids("input_ids", input_ids, vocab_size)
        _mask("padding_mask", padding_mask, input_ids)
        if padding_mask is not None and (padding_mask[:, :-1] & ~padding_mask[:, 1:]).any():
            raise ValueError("prompts must be left-padded (padding first, then the tokens): the new tokens go "
                             "in one column for every row")


def _mask(name: str, mask, ids: torch.Tensor) -> None:
    if mask is None:
        return
    if not torch.is_tensor(mask) or mask.dtype != torch.bool or mask.shape != ids.shape:
        raise ValueError(f"{name} must be a bool tensor of shape {tuple(ids.shape)} (True = real token)")
    if not mask.any(dim=1).all():
        raise ValueError(f"every row needs at least one real token (a row of {name} is all False)")


def check_memory(model, rows: int, total: int, num_beams: int, use_cache: bool) -> None:
    """Refuse, before allocating, a generation whose buffers do not fit in the memory available.

    rows = batch x beams sequences of `total` columns: the token buffers (int64; beam search keeps
    about four copies: live, finished, candidates, output) and, with the cache, keys and values
    for every layer, at most the context window long.
    """
    device = next(model.parameters()).device
    config = (model.decoder if isinstance(model, EncoderDecoderModel) else model).config
    element = next(model.parameters()).element_size()
    window = context_window(model)
    capacity = min(total, window) if window is not None else total
    cache = 2 * config.n_layers * rows * config.n_kv_heads * capacity * config.d_head * element if use_cache else 0
    tokens = rows * total * 8 * (4 if num_beams > 1 else 1)
    needed = cache + tokens
    free = available_memory(device)
    if free is not None and needed > free:
        raise ValueError(
            f"generating {total} positions for {rows} row(s) needs about {needed / 1e9:.3g} GB (KV cache and "
            f"token buffers), more than the {free / 1e9:.3g} GB available on {device}: lower max_new_tokens"
            + (" or num_beams" if num_beams > 1 else "")
        )


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device` (None where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return machine_memory() if device.type == "cpu" else None
