"""`anatomy parity PATH`: run one input through Hugging Face transformers and through anatomy (a GGUF
file through transformers' own GGUF loader), and
compare every intermediate the two can pair: the embeddings, each layer's hidden state and
attention weights, the final hidden state, the pooled vector and the logits.

anatomy's side comes from trace points (`blocks.0.attn.pattern`, ...), transformers' side from
output_hidden_states / output_attentions with the eager attention kernel. With padding, only real
positions are compared (padded queries compute values nobody reads).

    rows = parity_rows("minilm", texts=["Hello world."], pad=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..inputs import pad_batch
from ..trace import trace, trace_points
from .files import CheckpointError
from .gguf import gguf_file, gguf_tokenizer, load_gguf
from .hf import read_config
from .resolver import from_pretrained, locate
from .tokenizer import Tokenizer

DEFAULT_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world."]


@dataclass
class ParityRow:
    name: str  # anatomy trace point
    reference: str  # the transformers output it is compared with
    shape: tuple[int, ...]
    max_abs_diff: float
    ok: bool


@dataclass
class _Inputs:
    ids: torch.Tensor  # (B, T): the source for an encoder-decoder
    mask: torch.Tensor  # (B, T) bool, True = real token
    token_types: torch.Tensor | None = None
    tgt_ids: torch.Tensor | None = None  # encoder-decoder only
    tgt_mask: torch.Tensor | None = None


def _random_rows(vocab: int, lengths: list[int], avoid: int | None, generator) -> list[list[int]]:
    rows = []
    for n in lengths:
        row = torch.randint(0, vocab, (n,), generator=generator)
        if avoid is not None:
            row = torch.where(row == avoid, (row + 1) % vocab, row)
        rows.append(row.tolist())
    return rows


def _crop(rows: list[list[int]], limit: int, side: str, notes: list[str] | None) -> list[list[int]]:
    """Rows cut to the model's `limit` positions, and a note saying so."""
    longest = max(map(len, rows))
    if longest <= limit:
        return rows
    if notes is not None:
        notes.append(f"the {side} input has {longest} tokens; the model takes {limit} positions: "
                     f"compared on the first {limit}")
    return [row[:limit] for row in rows]


def make_inputs(directory: Path, config, texts=None, text_b=None, pad=False, seed=0,
                notes: list[str] | None = None, tokenizer: Tokenizer | None = None) -> _Inputs:
    """Token ids from `tokenizer` or the checkpoint's, or random ids when it ships none, cut to the
    model's max_seq_len (each cut is described in `notes`)."""
    texts = list(texts or DEFAULT_TEXTS[:1])
    if pad and len(texts) == 1:
        texts.append(DEFAULT_TEXTS[1] if texts[0] != DEFAULT_TEXTS[1] else DEFAULT_TEXTS[0])
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    generator = torch.Generator().manual_seed(seed)
    try:
        tokenizer = (tokenizer or Tokenizer.load(directory)).backend  # pairs and token types come from the backend
    except CheckpointError:
        tokenizer = None
    types = None
    if tokenizer is not None:
        pairs = [(t, text_b) for t in texts] if text_b and config.arch == "encoder" else texts
        encodings = tokenizer.encode_batch(pairs)
        side = "source" if config.arch == "encoder-decoder" else "text"
        ids, mask = pad_batch(_crop([e.ids for e in encodings], config.max_seq_len, side, notes), pad_id)
        if config.type_vocab_size:
            types, _ = pad_batch([e.type_ids[:config.max_seq_len] for e in encodings], 0)
    else:
        lengths = [7, 4, 6][: len(texts)] if pad else [7]
        ids, mask = pad_batch(_random_rows(config.vocab_size, lengths, config.pad_token_id, generator), pad_id)
        if config.type_vocab_size:
            types = torch.randint(0, config.type_vocab_size, ids.shape, generator=generator) * mask
    inputs = _Inputs(ids, mask, types)
    if config.arch == "encoder-decoder":
        start = config.decoder_start_token_id if config.decoder_start_token_id is not None else pad_id
        if tokenizer is not None:
            encodings = tokenizer.encode_batch([text_b or t for t in texts])
            rows = _crop([[start] + e.ids for e in encodings], config.max_seq_len, "target", notes)
        else:
            lengths = [5, 3, 4][: len(texts)] if pad else [5]
            rows = [[start] + r for r in _random_rows(config.vocab_size, lengths, config.pad_token_id, generator)]
        inputs.tgt_ids, inputs.tgt_mask = pad_batch(rows, pad_id)
    return inputs


# Intermediates only some families have: transformers' output field (a tensor per layer, [B*T, ...])
# -> (anatomy's trace point, the forward flag that asks transformers for it). Asked for when the
# anatomy model has the point.
PER_LAYER_OUTPUTS = {"router_logits": ("blocks.{i}.mlp.router_logits", "output_router_logits")}


def _per_layer_flags(model) -> dict:
    points = trace_points(model)
    return {flag: True for name, flag in PER_LAYER_OUTPUTS.values() if name.format(i=0) in points}


def _per_layer_pairs(out, ids: torch.Tensor, mask) -> list:
    pairs = []
    for field, (name, _) in PER_LAYER_OUTPUTS.items():
        for i, value in enumerate(getattr(out, field, None) or ()):
            pairs.append((name.format(i=i), f"{field}[{i}]", value.reshape(*ids.shape, -1), mask))  # (B, T, ...)
    return pairs


def _stack_pairs(prefix: str, hf_prefix: str, config, states, attentions, mask, final: str):
    """(anatomy name, transformers name, transformers tensor, mask) for one stack."""
    n = config.n_layers
    pairs = [(f"{prefix}blocks.0.resid_pre", f"{hf_prefix}hidden_states[0]", states[0], mask)]
    for i in range(n):
        pairs.append((f"{prefix}blocks.{i}.attn.pattern", f"{hf_prefix}attentions[{i}]", attentions[i], mask))
        name = f"{prefix}blocks.{i}.resid_post" if i < n - 1 else final
        pairs.append((name, f"{hf_prefix}hidden_states[{i + 1}]", states[i + 1], mask))
    return pairs


def _final(prefix: str, config) -> str:
    """The stack's last intermediate: after the final norm, and after project_out where there is one."""
    if config.d_embed != config.d_model:
        return f"{prefix}project_out.out"
    return f"{prefix}final_norm.out" if config.final_norm else f"{prefix}blocks.{config.n_layers - 1}.resid_post"


def _max_diff(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor | None, axes: tuple[str, ...]) -> float:
    """max |ours - theirs| over real positions: the mask [B, T] selects along batch and the
    position (or query) axis; key columns of padding are zero on both sides."""
    diff = (ours.float() - theirs.float()).abs()
    if mask is not None and len(axes) >= 2 and axes[0] == "batch":
        axis = 2 if axes[1] == "head" else 1
        diff = diff.movedim(axis, 1)[mask]
    return float(diff.max()) if diff.numel() else 0.0


@contextlib.contextmanager
def quiet_progress_bars():
    """transformers' and huggingface_hub's progress bars ("Loading weights", "Converting and
    de-quantizing GGUF tensors") off inside the block, then back as they were: parity's output is
    its table, and the caller's own use of those libraries is left alone. transformers' GGUF
    reader calls tqdm with no switch, so its module's `tqdm` is a silent one for the block (parity
    runs on one thread; the explorer's loads never come here)."""
    from functools import partial

    from huggingface_hub import utils as hub_utils
    from transformers import modeling_gguf_pytorch_utils as gguf_reader
    from transformers.utils import logging as transformers_logging

    shown, hub_hidden = transformers_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    bar = getattr(gguf_reader, "tqdm", None)
    transformers_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    if bar is not None:
        gguf_reader.tqdm = partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_reader.tqdm = bar
        if shown:
            transformers_logging.enable_progress_bar()
        if not hub_hidden:
            hub_utils.enable_progress_bars()


def parity_rows(path: str | Path, texts=None, text_b: str | None = None, pad: bool = False,
                tol: float = 1e-5, seed: int = 0, notes: list[str] | None = None,
                progress: Callable[[str], None] | None = None) -> list[ParityRow]:
    """Compare every pairable intermediate of anatomy and transformers on one input; one row each.
    A text longer than the model's positions is cut, and `notes` (if given) says so. A NaN
    difference is a failed row. `progress`, if given, is called with each stage's name as it starts
    (importing transformers, each load, each pass, the comparison): SmolLM2 takes 20-30 s."""
    say = progress or (lambda stage: None)
    say("importing transformers")
    import transformers

    source = locate(path)
    if source.kind not in ("folder", "gguf"):
        raise CheckpointError(f"parity compares with transformers a Hugging Face-format folder or a GGUF file; "
                              f"{str(path)!r} is {source.kind}")
    directory, tokenizer = source.path, None
    if source.kind == "gguf":  # the reference is transformers' own GGUF loader, on the same file
        file = gguf_file(source.path)
        directory, tokenizer = file.parent, gguf_tokenizer(file)
        say(f"loading {file.name} with anatomy")
        ours = load_gguf(file)
        say("loading it with transformers' GGUF reader")
        with quiet_progress_bars():
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                str(directory), gguf_file=file.name, attn_implementation="eager", dtype=torch.float32).eval()
    else:
        _, _, class_name = read_config(directory)
        say(f"loading {directory.name} with anatomy")
        ours = from_pretrained(directory, dtype=torch.float32)
        say(f"loading it with transformers ({class_name})")
        with quiet_progress_bars():
            theirs = getattr(transformers, class_name).from_pretrained(
                str(directory), attn_implementation="eager", dtype=torch.float32
            ).eval()
    config = ours.config
    x = make_inputs(directory, config, texts, text_b, pad, seed, notes, tokenizer)
    padded = not bool(x.mask.all()) or (x.tgt_mask is not None and not bool(x.tgt_mask.all()))
    flags = dict(output_hidden_states=True, output_attentions=True, return_dict=True)
    say(f"running transformers on {x.ids.size(0)} × {x.ids.size(1)} tokens, every intermediate kept")
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            out = theirs(input_ids=x.ids, attention_mask=x.mask.long(), decoder_input_ids=x.tgt_ids,
                         decoder_attention_mask=x.tgt_mask.long(), **flags)
            encoder, decoder = ours.encoder.config, ours.decoder.config  # their depths may differ
            pairs = _stack_pairs("encoder.", "encoder_", encoder, out.encoder_hidden_states,
                                 out.encoder_attentions, x.mask, _final("encoder.", encoder))
            pairs += _stack_pairs("decoder.", "decoder_", decoder, out.decoder_hidden_states,
                                  out.decoder_attentions, x.tgt_mask, _final("decoder.", decoder))
            pairs += [(f"decoder.blocks.{i}.cross_attn.pattern", f"cross_attentions[{i}]", a, x.tgt_mask)
                      for i, a in enumerate(out.cross_attentions)]
            pairs.append(("logits", "logits", out.logits, x.tgt_mask))
        else:
            kwargs = {"token_type_ids": x.token_types} if x.token_types is not None else {}
            out = theirs(input_ids=x.ids, attention_mask=x.mask.long(), **kwargs, **flags, **_per_layer_flags(ours))
            pairs = _stack_pairs("", "", config, out.hidden_states, out.attentions, x.mask, _final("", config))
            pairs += _per_layer_pairs(out, x.ids, x.mask)
            if getattr(out, "pooler_output", None) is not None and config.pooler:
                pairs.append(("pooled", "pooler_output", out.pooler_output, None))
            if getattr(out, "logits", None) is not None:
                pairs.append(("logits", "logits", out.logits, x.mask if out.logits.dim() == 3 else None))
        say(f"running anatomy, tracing {len(pairs)} intermediates")
        with trace(ours, [p[0] for p in pairs]) as t:
            if config.arch == "encoder-decoder":
                ours(x.ids, x.tgt_ids, x.mask if padded else None, x.tgt_mask if padded else None)
            elif config.arch == "encoder":
                ours(x.ids, padding_mask=x.mask if padded else None, token_type_ids=x.token_types)
            else:
                ours(x.ids, padding_mask=x.mask if padded else None)
    say(f"comparing {len(pairs)} intermediates")
    rows = []
    for name, reference, value, mask in pairs:
        mine = t[name]
        if tuple(mine.shape) != tuple(value.shape):
            rows.append(ParityRow(name, reference, tuple(mine.shape), float("inf"), False))
            continue
        diff = _max_diff(mine, value, mask if padded else None, t.axes(name))
        rows.append(ParityRow(name, reference, tuple(mine.shape), diff, diff <= tol))
    return rows
