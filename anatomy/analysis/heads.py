"""Finding heads by what they attend to, on repeated random tokens (Olsson et al. 2022, "In-context
Learning and Induction Heads"; TransformerLens's head_detector).

Shape letters: L layers, H heads, B batch, n length of the random sequence (the input is 2n).

The input is a seeded random sequence r of n tokens, repeated: [r, r]. At a position q = n + i of
the second copy (token r_i),

    previous_token:  attends to q - 1                (the token before)
    duplicate:       attends to i = q - n            (the same token, earlier)
    induction:       attends to i + 1 = q - n + 1    (the token that followed it last time)

The score of a head is the mean attention weight on that key over the queries where it exists
(previous-token: every query but the first), in [0, 1]: 1 is a perfect detector.
"""

from __future__ import annotations

import torch
from torch import nn

from ..trace import trace
from .choices import KINDS
from .inputs import Batch, Text
from .lens import stack_of
from .result import Result

LENGTH = 24  # the random sequence's length n by default (the input is 2n), where the model allows it


def repeated_tokens(vocab_size: int, length: int, batch: int, seed: int, avoid: set[int] = frozenset()) -> torch.Tensor:
    """[batch, 2*length] ids: a seeded random sequence of `length` distinct tokens, twice (on the CPU, as the
    seeded generator draws them)."""
    allowed = torch.tensor([i for i in range(vocab_size) if i not in avoid], device="cpu")
    if len(allowed) < length:
        raise ValueError(f"a sequence of {length} distinct tokens needs a vocabulary of at least {length} "
                         f"(this one offers {len(allowed)}); pass a smaller length")
    generator = torch.Generator().manual_seed(seed)
    rows = [allowed[torch.randperm(len(allowed), generator=generator, device="cpu")[:length]] for _ in range(batch)]
    half = torch.stack(rows)  # (B, n)
    return torch.cat([half, half], dim=1)  # (B, 2n)


def _keys(kind: str, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, keys): the cells of a [2n, 2n] pattern that the kind's ideal head attends to."""
    if kind == "previous_token":
        queries = torch.arange(1, 2 * length, device=device)
        return queries, queries - 1
    queries = torch.arange(length, 2 * length, device=device)
    return queries, queries - length + (kind == "induction")


def detect_heads(
    model: nn.Module, kind: str = "induction", *, length: int | None = None, batch: int = 8, seed: int = 0,
    runs_per_pass: int | None = None, progress=None,
) -> Result:
    """[layer, head] scores of `kind` ("previous_token", "induction" or "duplicate") on `batch`
    seeded random sequences of `length` distinct tokens (default: 24, or fewer where the positions
    or the vocabulary allow fewer), repeated. Special tokens are avoided. An encoder-decoder is
    scored on its decoder's self-attention, with the same sequence as source.

    runs_per_pass: how many of the sequences one forward pass reads (default: all). progress(done,
    total): called before the first pass (done = 0) and after each, with the sequences read so
    far; an exception it raises stops the analysis (how a caller cancels it)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(KINDS)}")
    config = model.config
    special = {getattr(config, name) for name in ("pad_token_id", "bos_token_id", "eos_token_id")} - {None}
    limit = config.max_seq_len if config.pos_encoding in ("learned", "sinusoidal", "rotary") else None
    if length is None:
        length = min(LENGTH, config.vocab_size - len(special), (limit or 2 * LENGTH) // 2)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be >= 2 (got {length}): a repeated sequence needs two distinct tokens")
    if limit is not None and 2 * length > limit:
        raise ValueError(f"2 x length = {2 * length} positions exceed max_seq_len={limit}; pass a smaller length")
    if runs_per_pass is not None and (isinstance(runs_per_pass, bool) or not isinstance(runs_per_pass, int)
                                      or runs_per_pass < 1):
        raise ValueError(f"runs_per_pass must be an integer >= 1, got {runs_per_pass!r}")
    model.eval()
    ids = repeated_tokens(config.vocab_size, length, batch, seed, special)
    prefix = "decoder." if config.arch == "encoder-decoder" else ""
    n_layers = len(stack_of(model).blocks)
    chunk = runs_per_pass or batch
    progress = progress or (lambda done, total: None)
    parts = []
    progress(0, batch)
    for start in range(0, batch, chunk):
        rows = ids[start:start + chunk]  # (b, 2n)
        text = Text(rows, None, [[str(int(i)) for i in row] for row in rows])
        inputs = Batch(text, text) if config.arch == "encoder-decoder" else Batch(text)
        with torch.no_grad(), trace(model, f"{prefix}blocks.*.attn.pattern") as t:
            inputs.run(model)
        parts.append(torch.stack([t[f"{prefix}blocks.{i}.attn.pattern"] for i in range(n_layers)]))  # (L, b, H, 2n, 2n)
        progress(start + len(rows), batch)
    patterns = torch.cat(parts, dim=1)  # (L, B, H, 2n, 2n)
    queries, keys = _keys(kind, length, patterns.device)
    scores = patterns[..., queries, keys].mean(dim=(1, 3))  # (L, H)
    best = divmod(int(scores.argmax()), scores.size(1))
    return Result(
        f"{kind.replace('_', '-')} heads", scores, ("layer", "head"),
        labels={"layer": [str(i) for i in range(n_layers)], "head": [str(h) for h in range(scores.size(1))]},
        check=f"scores are mean attention weights in [0, 1]; strongest L{best[0]}H{best[1]} = {scores.max().item():.3f}",
        extra={"kind": kind, "length": length, "ids": ids},
    )
