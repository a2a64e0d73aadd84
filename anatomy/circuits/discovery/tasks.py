"""Tasks: datasets of clean/corrupted prompt pairs with a metric, the input of circuit discovery.

Shape letters: N pairs, T positions (right-padded), A answers per pair, V vocabulary.

A behaviour is measured on pairs that differ only where the behaviour's evidence is (Wang et al.
2022, "Interpretability in the Wild", indirect object identification):

    clean    "When Mary and John went to the store, John gave a drink to"    -> " Mary"
    corrupt  "When Mary and John went to the store, Tom gave a drink to"     (no repeated name)

and by a metric of the last position's logits, by default the logit difference between the right
answer and the wrong one:

    m(x) = logit(x)[answer] - logit(x)[wrong]

Patching puts one run's activations into the other position by position, so the two prompts of a
pair have the same number of tokens; pairs may differ in length from one another (right padding).
The classic tasks (generators.py) are built with each model's own tokenizer and keep only the pairs
the model gets right (m(clean) > 0), saying how many they dropped.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...analysis.inputs import Batch, Text
from ...checkpoints.files import shorten
from ...text import check_text
from .choices import MAX_PAIRS

Metric = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MAX_LINE = 1_000_000  # bytes of one JSONL pair: two prompts and their answers
MAX_ANSWERS = 1_000  # texts a pair lists as its answers (greater-than lists up to 99)
MAX_BLANK = 10_000  # blank lines of a pair file


def logit_difference(logits: torch.Tensor, answers: torch.Tensor, wrongs: torch.Tensor) -> torch.Tensor:
    """logits [B, V], answers and wrongs [B, A] -> [B]: logit[answer] - logit[wrong] (the first of each)."""
    return logits.gather(1, answers[:, :1])[:, 0] - logits.gather(1, wrongs[:, :1])[:, 0]


def probability_difference(logits: torch.Tensor, answers: torch.Tensor, wrongs: torch.Tensor) -> torch.Tensor:
    """logits [B, V], answers and wrongs [B, A] (-1 = none) -> [B]: the probability of the right answers
    minus that of the wrong ones, sum_{a in answers} p(a) - sum_{w in wrongs} p(w) (Hanna et al. 2023,
    greater-than)."""
    probs = torch.softmax(logits.float(), dim=-1)  # (B, V)

    def mass(ids: torch.Tensor) -> torch.Tensor:
        return (probs.gather(1, ids.clamp(min=0)) * (ids >= 0)).sum(dim=1)  # (B,)

    return mass(answers) - mass(wrongs)


METRICS = {"logit-diff": logit_difference, "prob-diff": probability_difference}


@dataclass
class Task:
    """N clean/corrupted pairs and the metric that scores a pair's last position.

    clean, corrupt [N, T] token ids, right-padded; lengths [N] real tokens of each pair (the same
    for both prompts of a pair); answers, wrongs [N, A] token ids (-1 where a pair has fewer);
    metric(logits [B, V], answers [B, A], wrongs [B, A]) -> [B].
    """

    name: str
    clean: torch.Tensor
    corrupt: torch.Tensor
    lengths: torch.Tensor
    answers: torch.Tensor
    wrongs: torch.Tensor
    metric: Metric = logit_difference
    texts: list[tuple[str, str]] = field(default_factory=list)  # (clean, corrupt) as written
    tokens: list[list[str]] = field(default_factory=list)  # the clean prompts' tokens, as text
    dropped: int = 0  # pairs a generator made and dropped because the model got them wrong
    about: str = ""

    def __post_init__(self) -> None:
        n = self.clean.size(0)
        if self.clean.shape != self.corrupt.shape:
            raise ValueError(f"task {self.name!r}: clean ids {tuple(self.clean.shape)} and corrupted ids "
                             f"{tuple(self.corrupt.shape)} differ in shape; each pair needs as many tokens on both sides")
        for name in ("lengths", "answers", "wrongs"):
            if getattr(self, name).size(0) != n:
                raise ValueError(f"task {self.name!r}: {name} has {getattr(self, name).size(0)} rows for {n} pairs")
        if n == 0:
            raise ValueError(f"task {self.name!r} has no pairs")
        check_metric(self.metric, self.answers[:2], self.wrongs[:2], int(self.clean.max()) + 1)

    def __len__(self) -> int:
        return self.clean.size(0)

    def __repr__(self) -> str:
        """Task('ioi', 100 pairs of 14–19 tokens, metric logit_difference, 3 dropped): what it holds, no tensors."""
        low, high = int(self.lengths.min()), int(self.lengths.max())
        tokens = f"{low}" if low == high else f"{low}–{high}"
        metric = getattr(self.metric, "__name__", type(self.metric).__name__)
        return (f"Task({self.name!r}, {len(self)} pairs of {tokens} tokens, metric {metric}"
                + (f", {self.dropped} dropped" if self.dropped else "") + ")")

    def batches(self, size: int) -> list[range]:
        """The rows in consecutive chunks of at most `size` pairs."""
        return [range(start, min(start + size, len(self))) for start in range(0, len(self), size)]

    def inputs(self, rows: Sequence[int]) -> tuple[Batch, Batch]:
        """(clean, corrupt) Batches of these rows, cut to their longest pair, with a padding mask
        (True = real token) when some pair is shorter."""
        rows = torch.as_tensor(list(rows), device=self.lengths.device)
        lengths = self.lengths[rows]
        width = int(lengths.max())
        mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
        mask = None if bool(mask.all()) else mask
        tokens = [self.tokens[r] for r in rows.tolist()] if self.tokens else [[] for _ in rows]
        clean = Text(self.clean[rows, :width], mask, tokens)
        corrupt = Text(self.corrupt[rows, :width], mask, tokens)
        return Batch(clean), Batch(corrupt)

    def score(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """The metric of these rows' last-position logits [n*B, V] (n copies of the rows) -> [n*B]."""
        rows = list(rows)
        copies = logits.size(0) // len(rows)
        answers, wrongs = (ids[rows].to(logits.device).repeat(copies, 1) for ids in (self.answers, self.wrongs))
        values = self.metric(logits, answers, wrongs)
        if values.shape != (logits.size(0),):
            raise ValueError(f"the metric must return one number per pair, shape ({logits.size(0)},); got "
                             f"{tuple(values.shape)}")
        return values


def check_metric(metric: Metric, answers: torch.Tensor, wrongs: torch.Tensor, vocab: int) -> None:
    """Call `metric` on zero logits [B, vocab] and refuse it unless it returns one number per pair [B]."""
    if not callable(metric):
        raise ValueError(f"metric must be a function (logits [batch, vocab], answers, wrongs) -> [batch], "
                         f"or one of {', '.join(METRICS)}; got {type(metric).__name__}")
    vocab = max(vocab, int(answers.max()) + 1, int(wrongs.max()) + 1)
    try:
        values = metric(torch.zeros(answers.size(0), vocab, device=answers.device), answers, wrongs)
    except Exception as error:  # a user's function: its own error, named as the metric's
        raise ValueError(f"the metric failed on logits [{answers.size(0)}, vocab]: {type(error).__name__}: {error}") from None
    shape = tuple(values.shape) if torch.is_tensor(values) else type(values).__name__
    if not torch.is_tensor(values) or values.shape != (answers.size(0),):
        raise ValueError(f"the metric must return one number per pair (a tensor of shape ({answers.size(0)},) "
                         f"for {answers.size(0)} pairs); it returned {shape}")


# ---- building a task from texts ------------------------------------------------------------------


def one_token(tokenizer, text: str, what: str) -> int:
    """The id of `text` as one token (encoded alone, no special tokens); ValueError naming it otherwise."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        pieces = " + ".join(repr(piece) for piece in tokenizer.token_texts(ids))
        raise ValueError(f"{what} {text!r} is {len(ids)} tokens for this tokenizer ({pieces}); answers must be "
                         f"single tokens")
    return ids[0]


def make_task(
    model: nn.Module, name: str, pairs: Sequence[dict], *, metric: Metric | str = "logit-diff", about: str = "",
) -> Task:
    """A Task from pairs {"clean": text, "corrupt": text, "answer": text | [texts], "wrong": text | [texts]}.

    Each text is encoded as a prompt by the model's tokenizer; each answer must be one token. For a sequence
    classifier (an encoder with head="sequence-classification"), each text is encoded whole ([CLS] ... [SEP])
    and the answers are labels (label_index): the metric reads the label logits, e.g. logit[positive] -
    logit[negative] of a sentiment classifier on "a great film" / "a dull film".
    Raises ValueError, naming the pair, for a text that is empty or not a string, prompts of unequal length
    or past the model's context, a clean prompt equal to its corrupted one (patching would change nothing),
    an answer of several tokens, or an answer that is also a wrong answer (the metric would be 0 or NaN).
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("a task from texts needs the model's tokenizer (anatomy.from_pretrained attaches it)")
    if isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(f"metric={shorten(repr(metric), 80)} is not supported; allowed values: "
                             f"{', '.join(METRICS)}, or a function")
        metric = METRICS[metric]
    if not isinstance(pairs, Sequence) or isinstance(pairs, (str, bytes)):
        raise ValueError(f"pairs must be a list of objects with clean, corrupt, answer, wrong; got {type(pairs).__name__}")
    if not pairs:
        raise ValueError(f"task {shorten(repr(name), 80)} has no pairs")
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f"task {shorten(repr(name), 80)} has {len(pairs)} pairs; at most {MAX_PAIRS}")
    limit = model.config.max_seq_len if model.config.pos_encoding in ("learned", "sinusoidal", "rotary") else None
    classifier = model.config.head == "sequence-classification"
    clean_rows, corrupt_rows, answers, wrongs, texts = [], [], [], [], []
    for index, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            raise ValueError(f"pair {index} must be an object with clean, corrupt, answer, wrong; got {type(pair).__name__}")
        missing = [key for key in ("clean", "corrupt", "answer", "wrong") if key not in pair]
        if missing:
            raise ValueError(f"pair {index}: missing {', '.join(missing)}; each pair has clean, corrupt, answer, wrong")
        clean_text, corrupt_text = (check_text(pair[key], f"pair {index}: {key}") for key in ("clean", "corrupt"))
        encode = tokenizer.encode if classifier else tokenizer.encode_prompt
        clean, corrupt = encode(clean_text), encode(corrupt_text)
        if len(clean) != len(corrupt):
            raise ValueError(f"pair {index}: the clean prompt has {len(clean)} tokens, the corrupted {len(corrupt)}; "
                             f"patching needs both prompts of a pair to have as many tokens")
        if limit is not None and len(clean) > limit:
            raise ValueError(f"pair {index}: the prompts have {len(clean)} tokens; this model reads at most {limit}")
        if clean == corrupt:
            raise ValueError(f"pair {index}: the clean and corrupted prompts are the same tokens; patching one into the "
                             "other would change nothing")
        if classifier:
            answer, wrong = (labels(model, pair[key], index, key) for key in ("answer", "wrong"))
        else:
            answer = [one_token(tokenizer, text, f"pair {index}: answer") for text in answer_texts(pair["answer"], index, "answer")]
            wrong = [one_token(tokenizer, text, f"pair {index}: wrong answer") for text in answer_texts(pair["wrong"], index, "wrong")]
        both = sorted(set(answer) & set(wrong))
        if both:
            shown = f"label {both[0]}" if classifier else shorten(repr(tokenizer.token_texts(both[:1])[0]), 40)
            raise ValueError(f"pair {index}: {shown} is both an answer and a wrong answer; the metric compares the two")
        answers.append(answer)
        wrongs.append(wrong)
        clean_rows.append(clean)
        corrupt_rows.append(corrupt)
        texts.append((clean_text, corrupt_text))
    return _assemble(name, clean_rows, corrupt_rows, answers, wrongs, metric, texts, tokenizer, about)


def label_index(model: nn.Module, label, what: str) -> int:
    """A sequence classifier's label: its index (an int, or its digits), or its Hugging Face name "LABEL_i";
    ValueError naming the allowed labels otherwise."""
    count = model.config.num_labels
    text = str(label)
    digits = text[len("LABEL_"):] if text.startswith("LABEL_") else text
    if isinstance(label, bool) or not isinstance(label, (int, str)) or not digits.isdigit() or not 0 <= int(digits) < count:
        raise ValueError(f"{what} {shorten(repr(label), 80)} is not a label of this classifier; allowed: 0 to {count - 1} "
                         f"(or LABEL_0 to LABEL_{count - 1})")
    return int(digits)


def labels(model: nn.Module, value, index: int, key: str) -> list[int]:
    """A classifier's answer (or wrong answer): a label or a list of 1 .. MAX_ANSWERS labels, as indices."""
    values = value if isinstance(value, list) else [value]
    if not 1 <= len(values) <= MAX_ANSWERS:
        raise ValueError(f"pair {index}: {key} must be a label or a list of 1 to {MAX_ANSWERS} labels; got "
                         f"{shorten(repr(value), 80)}")
    return [label_index(model, v, f"pair {index}: {key}") for v in values]


def answer_texts(value, index: int, key: str) -> list[str]:
    """An answer (or wrong answer) as a list of 1 .. MAX_ANSWERS texts, each a non-empty string."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_ANSWERS:
        raise ValueError(f"pair {index}: {key} must be a text or a list of 1 to {MAX_ANSWERS} texts; got "
                         f"{shorten(repr(value), 80)}")
    for text in texts:
        if not isinstance(text, str) or not text:
            raise ValueError(f"pair {index}: each {key} is a non-empty text; got {shorten(repr(text), 80)}")
        check_text(text, f"pair {index}: {key}", empty=True)
    return texts


def _assemble(name, clean_rows, corrupt_rows, answers, wrongs, metric, texts, tokenizer, about) -> Task:
    width = max(len(row) for row in clean_rows)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0

    def padded(rows: list[list[int]], fill: int, size: int) -> torch.Tensor:
        return torch.tensor([row + [fill] * (size - len(row)) for row in rows], dtype=torch.long, device="cpu")

    n_answers = max(len(row) for row in answers + wrongs)
    return Task(
        name, padded(clean_rows, pad, width), padded(corrupt_rows, pad, width),
        torch.tensor([len(row) for row in clean_rows], device="cpu"), padded(answers, -1, n_answers), padded(wrongs, -1, n_answers),
        metric, texts, [tokenizer.labels(row) + [""] * (width - len(row)) for row in clean_rows], about=about,
    )


def load_pairs(model: nn.Module, path: str | Path, *, metric: Metric | str = "logit-diff", limit: int = MAX_PAIRS
               ) -> Task:
    """A Task from a JSONL file, one pair a line: {"clean": ..., "corrupt": ..., "answer": ..., "wrong": ...};
    the first `limit` pairs, read a line at a time (no line longer than MAX_LINE bytes is read whole).
    Raises ValueError naming the file and the line for anything that is not a pair (make_task's checks)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a .jsonl file of pairs, got {type(path).__name__}")
    path = Path(path)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAIRS:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAIRS}, got {shorten(repr(limit), 80)}")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{shorten(str(path))} is not a file of pairs (a folder, a device or a pipe)")
        handle = path.open("rb")
    except OSError as error:
        raise ValueError(f"{shorten(str(path))}: {error.strerror or error}") from None
    pairs, lines = [], []
    with handle:
        for number in itertools.count(1):
            raw = handle.readline(MAX_LINE + 1)
            if not raw or len(pairs) >= limit:
                break
            if number - len(pairs) > MAX_BLANK:
                raise ValueError(f"{path.name} has more than {MAX_BLANK:,} blank lines by line {number:,}; a file of "
                                 "pairs has one pair a line")
            if len(raw) > MAX_LINE:
                raise ValueError(f"{path.name} line {number} is longer than {MAX_LINE:,} bytes; a pair of prompts is "
                                 "far shorter")
            pair = _pair(raw, f"{path.name} line {number}")
            if pair is not None:
                pairs.append(pair)
                lines.append(number)
    try:
        return make_task(model, path.stem, pairs, metric=metric, about=f"pairs from {path.name}")
    except ValueError as error:  # "pair 3: ..." is the fourth pair read: say which line of which file
        found = re.match(r"pair (\d+)", str(error))
        where = f"{path.name} line {lines[int(found.group(1))]}, " if found else f"{path.name}: "
        raise ValueError(where + str(error)) from None


def _pair(raw: bytes, where: str) -> dict | None:
    """One line's pair (None for a blank line): UTF-8 JSON of an object whose four texts are strings or lists."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: not UTF-8 (byte {error.start + 1})") from None
    if not line.strip():
        return None
    try:
        pair = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to be a pair") from None
    if not isinstance(pair, dict) or not all(isinstance(pair.get(k), (str, list)) for k in ("clean", "corrupt")) \
            or not all(isinstance(pair.get(k), (str, int, list)) for k in ("answer", "wrong")):
        raise ValueError(f"{where}: each line is an object with the texts clean, corrupt, answer and wrong (a "
                         f"classifier's answers may be label numbers)")
    return pair


def clean_scores(model: nn.Module, task: Task, batch_size: int = 32, *, enough: int | None = None) -> torch.Tensor:
    """[N]: the metric of every clean prompt (one batched forward pass per chunk, last position only).
    With `enough`, stop after the chunk where that many pairs score above 0 (the rest are NaN)."""
    model.eval()
    values = torch.full((len(task),), float("nan"), device="cpu")
    with torch.no_grad():
        for rows in task.batches(batch_size):
            clean, _ = task.inputs(rows)
            values[rows.start:rows.stop] = task.score(clean.last_logits(model)[:, 0], rows).float().cpu()
            if enough is not None and int((values > 0).sum()) >= enough:
                break
    return values


def keep_correct(model: nn.Module, task: Task, n: int) -> Task:
    """The first n pairs the model gets right (m(clean) > 0); task.dropped counts those it got wrong
    among the pairs it looked at."""
    right = clean_scores(model, task, enough=n) > 0
    keep = right.nonzero()[:, 0]
    considered = int(keep[n - 1]) + 1 if len(keep) >= n else len(task)
    keep = keep[:n]
    if len(keep) == 0:
        raise ValueError(f"the model gets none of the {len(task)} {task.name} pairs right (metric > 0 on the clean "
                         f"prompt): there is no behaviour to explain")
    rows = keep.tolist()
    return Task(task.name, task.clean[keep], task.corrupt[keep], task.lengths[keep], task.answers[keep],
                task.wrongs[keep], task.metric, [task.texts[r] for r in rows], [task.tokens[r] for r in rows],
                dropped=considered - len(keep), about=task.about)
