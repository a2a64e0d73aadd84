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
Generators build the classic tasks with each model's own tokenizer, keep only the pairs the model
gets right (m(clean) > 0) and say how many they dropped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...analysis.inputs import Batch, Text

Metric = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MAX_PAIRS = 100_000


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

    def batches(self, size: int) -> list[range]:
        """The rows in consecutive chunks of at most `size` pairs."""
        return [range(start, min(start + size, len(self))) for start in range(0, len(self), size)]

    def inputs(self, rows: Sequence[int]) -> tuple[Batch, Batch]:
        """(clean, corrupt) Batches of these rows, cut to their longest pair, with a padding mask
        (True = real token) when some pair is shorter."""
        rows = torch.as_tensor(list(rows))
        lengths = self.lengths[rows]
        width = int(lengths.max())
        mask = torch.arange(width)[None, :] < lengths[:, None]  # (B, T)
        mask = None if bool(mask.all()) else mask
        tokens = [self.tokens[r] for r in rows.tolist()] if self.tokens else [[] for _ in rows]
        clean = Text(self.clean[rows, :width], mask, tokens)
        corrupt = Text(self.corrupt[rows, :width], mask, tokens)
        return Batch(clean), Batch(corrupt)

    def score(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """The metric of these rows' last-position logits [n*B, V] (n copies of the rows) -> [n*B]."""
        rows = torch.as_tensor(list(rows))
        copies = logits.size(0) // len(rows)
        values = self.metric(logits, self.answers[rows].repeat(copies, 1), self.wrongs[rows].repeat(copies, 1))
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
        values = metric(torch.zeros(answers.size(0), vocab), answers, wrongs)
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

    Each text is encoded as a prompt by the model's tokenizer; each answer must be one token.
    Raises ValueError, naming the pair, for prompts of unequal length or an answer of several tokens.
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("a task from texts needs the model's tokenizer (anatomy.from_pretrained attaches it)")
    if isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(f"metric={metric!r} is not supported; allowed values: {', '.join(METRICS)}, or a function")
        metric = METRICS[metric]
    if not pairs:
        raise ValueError(f"task {name!r} has no pairs")
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f"task {name!r} has {len(pairs)} pairs; at most {MAX_PAIRS}")
    clean_rows, corrupt_rows, answers, wrongs, texts = [], [], [], [], []
    for index, pair in enumerate(pairs):
        missing = [key for key in ("clean", "corrupt", "answer", "wrong") if key not in pair]
        if missing:
            raise ValueError(f"pair {index}: missing {', '.join(missing)}; each pair has clean, corrupt, answer, wrong")
        clean, corrupt = tokenizer.encode_prompt(pair["clean"]), tokenizer.encode_prompt(pair["corrupt"])
        if len(clean) != len(corrupt):
            raise ValueError(f"pair {index}: the clean prompt has {len(clean)} tokens, the corrupted {len(corrupt)}; "
                             f"patching needs both prompts of a pair to have as many tokens")
        answer = [pair["answer"]] if isinstance(pair["answer"], str) else list(pair["answer"])
        wrong = [pair["wrong"]] if isinstance(pair["wrong"], str) else list(pair["wrong"])
        answers.append([one_token(tokenizer, text, f"pair {index}: answer") for text in answer])
        wrongs.append([one_token(tokenizer, text, f"pair {index}: wrong answer") for text in wrong])
        clean_rows.append(clean)
        corrupt_rows.append(corrupt)
        texts.append((pair["clean"], pair["corrupt"]))
    return _assemble(name, clean_rows, corrupt_rows, answers, wrongs, metric, texts, tokenizer, about)


def _assemble(name, clean_rows, corrupt_rows, answers, wrongs, metric, texts, tokenizer, about) -> Task:
    width = max(len(row) for row in clean_rows)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0

    def padded(rows: list[list[int]], fill: int, size: int) -> torch.Tensor:
        return torch.tensor([row + [fill] * (size - len(row)) for row in rows], dtype=torch.long)

    n_answers = max(len(row) for row in answers + wrongs)
    return Task(
        name, padded(clean_rows, pad, width), padded(corrupt_rows, pad, width),
        torch.tensor([len(row) for row in clean_rows]), padded(answers, -1, n_answers), padded(wrongs, -1, n_answers),
        metric, texts, [tokenizer.labels(row) + [""] * (width - len(row)) for row in clean_rows], about=about,
    )


def load_pairs(model: nn.Module, path: str | Path, *, metric: Metric | str = "logit-diff") -> Task:
    """A Task from a JSONL file, one pair a line: {"clean": ..., "corrupt": ..., "answer": ..., "wrong": ...}."""
    path = Path(path)
    pairs = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                pair = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path.name} line {number}: not JSON ({error.msg})") from None
            if not isinstance(pair, dict) or not all(isinstance(pair.get(k), (str, list)) for k in ("clean", "corrupt", "answer", "wrong")):
                raise ValueError(f"{path.name} line {number}: each line is an object with the texts clean, corrupt, "
                                 f"answer and wrong")
            pairs.append(pair)
            if len(pairs) > MAX_PAIRS:
                raise ValueError(f"{path.name} has more than {MAX_PAIRS} pairs")
    return make_task(model, path.stem, pairs, metric=metric, about=f"pairs from {path.name}")


def clean_scores(model: nn.Module, task: Task, batch_size: int = 32, *, enough: int | None = None) -> torch.Tensor:
    """[N]: the metric of every clean prompt (one batched forward pass per chunk, last position only).
    With `enough`, stop after the chunk where that many pairs score above 0 (the rest are NaN)."""
    model.eval()
    values = torch.full((len(task),), float("nan"))
    with torch.no_grad():
        for rows in task.batches(batch_size):
            clean, _ = task.inputs(rows)
            values[rows.start:rows.stop] = task.score(clean.last_logits(model)[:, 0], rows).float()
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


# ---- the classic tasks ---------------------------------------------------------------------------

NAMES = ["Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Paul", "Anna", "Kate", "Mark", "Lisa",
         "David", "Sarah", "Peter", "Laura", "Michael", "Emma", "Chris", "Alice", "Bob", "Jack", "Sam", "Ben",
         "Rose", "Jane", "Max", "Luke", "Adam", "Eric", "Ryan", "Alex", "Steve", "Mike", "Joe", "George", "Frank"]
PLACES = ["store", "park", "school", "office", "garden", "station", "beach", "market"]
OBJECTS = ["drink", "book", "ring", "kiss", "bone", "basketball", "computer", "necklace"]
IOI_TEMPLATES = [  # {A} is the indirect object (the answer), {B} the subject, {S2} the subject's second mention
    "When {A} and {B} went to the {place}, {S2} gave a {object} to",
    "When {B} and {A} went to the {place}, {S2} gave a {object} to",
    "Then, {A} and {B} went to the {place}. {S2} gave a {object} to",
    "Then, {B} and {A} had a lot of fun at the {place}. {S2} gave a {object} to",
    "After {A} and {B} went to the {place}, {S2} gave a {object} to",
    "While {B} and {A} were working at the {place}, {S2} gave a {object} to",
]
COUNTRIES = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"), ("Japan", "Tokyo"),
             ("Russia", "Moscow"), ("Egypt", "Cairo"), ("England", "London"), ("China", "Beijing"),
             ("Greece", "Athens"), ("Austria", "Vienna"), ("Ireland", "Dublin"), ("Poland", "Warsaw"),
             ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Norway", "Oslo"),
             ("Sweden", "Stockholm"), ("Portugal", "Lisbon"), ("Thailand", "Bangkok"), ("India", "Delhi"),
             ("Turkey", "Ankara"), ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Denmark", "Copenhagen")]
CAPITAL_TEMPLATES = ["The capital of {country} is", "{country}'s capital city is", "The capital city of {country} is"]
NOUNS = [("key", "keys"), ("dog", "dogs"), ("author", "authors"), ("teacher", "teachers"), ("boy", "boys"),
         ("girl", "girls"), ("car", "cars"), ("house", "houses"), ("doctor", "doctors"), ("picture", "pictures"),
         ("student", "students"), ("bird", "birds"), ("friend", "friends"), ("letter", "letters")]
SVA_TEMPLATES = ["The {noun} near the {other}", "The {noun} behind the {other}", "The {noun} of the {other}",
                 "The {noun} next to the {other}"]
OTHERS = ["table", "window", "river", "door", "tree", "wall", "bridge", "road"]
EVENTS = ["war", "expedition", "reign", "drought", "construction", "trial", "siege", "voyage"]


def _single(tokenizer, words: Sequence[str]) -> list[str]:
    """The words that are one token with a space before them."""
    return [w for w in words if len(tokenizer.encode(" " + w, add_special_tokens=False)) == 1]


def ioi(model: nn.Module, n: int = 100, *, seed: int = 0) -> Task:
    """Indirect object identification (Wang et al. 2022) with single-token names: "When Mary and John
    went to the store, John gave a drink to" -> " Mary" (not " John"); the corrupted prompt names a third
    person in place of the subject's second mention (their ABC dataset)."""
    tokenizer = _tokenizer(model)
    names = _single(tokenizer, NAMES)
    if len(names) < 3:
        raise ValueError("ioi needs three names that are single tokens for this tokenizer; it has fewer")
    rng = random.Random(seed)
    pairs = []
    for _ in range(3 * n):
        a, b, c = rng.sample(names, 3)
        template, place, thing = rng.choice(IOI_TEMPLATES), rng.choice(PLACES), rng.choice(OBJECTS)
        fill = dict(A=a, B=b, place=place, object=thing)
        pairs.append({"clean": template.format(S2=b, **fill), "corrupt": template.format(S2=c, **fill),
                      "answer": " " + a, "wrong": " " + b})
    return _generated(model, "ioi", pairs, n, "logit-diff", "indirect object identification (Wang et al. 2022)")


def capital_country(model: nn.Module, n: int = 100, *, seed: int = 0) -> Task:
    """"The capital of France is" -> " Paris" (not the corrupted country's capital); the corrupted prompt
    names another country of as many tokens."""
    tokenizer = _tokenizer(model)
    usable = [(country, capital) for country, capital in COUNTRIES if _single(tokenizer, [capital])]
    rng = random.Random(seed)
    pairs = []
    for _ in range(3 * n):
        (country, capital), (other, other_capital) = rng.sample(usable, 2)
        template = rng.choice(CAPITAL_TEMPLATES)
        clean, corrupt = template.format(country=country), template.format(country=other)
        if len(tokenizer.encode_prompt(clean)) == len(tokenizer.encode_prompt(corrupt)):
            pairs.append({"clean": clean, "corrupt": corrupt, "answer": " " + capital, "wrong": " " + other_capital})
    return _generated(model, "capital-country", pairs, n, "logit-diff", "capital of a country")


def subject_verb(model: nn.Module, n: int = 100, *, seed: int = 0) -> Task:
    """Subject-verb agreement: "The key near the table" -> " is" (not " are"); the corrupted prompt has
    the subject in the other number, and pairs run both ways."""
    tokenizer = _tokenizer(model)
    nouns = [(s, p) for s, p in NOUNS if _single(tokenizer, [s]) and _single(tokenizer, [p])]
    rng = random.Random(seed)
    pairs = []
    for _ in range(3 * n):
        singular, plural = rng.choice(nouns)
        template, other = rng.choice(SVA_TEMPLATES), rng.choice(OTHERS)
        one, many = template.format(noun=singular, other=other), template.format(noun=plural, other=other)
        pairs.append({"clean": one, "corrupt": many, "answer": " is", "wrong": " are"} if rng.random() < 0.5 else
                     {"clean": many, "corrupt": one, "answer": " are", "wrong": " is"})
    return _generated(model, "sva", pairs, n, "logit-diff", "subject-verb agreement")


def greater_than(model: nn.Module, n: int = 100, *, seed: int = 0) -> Task:
    """Greater-than (Hanna et al. 2023): "The war lasted from the year 1732 to the year 17" -> a year
    after 32. The metric is the probability of the later years minus that of the earlier ones; the
    corrupted prompt starts at 1701. Where two-digit years are single tokens (GPT-2) the answers are
    those tokens; where numbers are read digit by digit (Llama, SmolLM2) they are the next digit: the
    tens digit above the start's, against those below it."""
    tokenizer = _tokenizer(model)
    probe = "The war lasted from the year 1732 to the year 17"
    two_digit = all(_continuation(tokenizer, probe, f"{yy:02d}") is not None for yy in range(100))
    digits = [_continuation(tokenizer, probe, str(d)) for d in range(10)]
    if not two_digit and any(d is None for d in digits):
        raise ValueError("greater-than needs two-digit years or single digits to be single tokens; this tokenizer "
                         "has neither")
    rng = random.Random(seed)
    pairs = []
    for _ in range(3 * n):
        event, century = rng.choice(EVENTS), rng.randint(11, 17)
        start = rng.randint(2, 98) if two_digit else rng.randint(2, 8) * 10 + rng.randint(0, 9)
        clean = f"The {event} lasted from the year {century}{start:02d} to the year {century}"
        corrupt = f"The {event} lasted from the year {century}01 to the year {century}"
        if two_digit:
            later = [f"{yy:02d}" for yy in range(start + 1, 100)]
            earlier = [f"{yy:02d}" for yy in range(0, start + 1)]
        else:
            later = [str(d) for d in range(start // 10 + 1, 10)]
            earlier = [str(d) for d in range(0, start // 10)]
        pairs.append({"clean": clean, "corrupt": corrupt, "answer": later, "wrong": earlier})
    return _generated(model, "greater-than", pairs, n, "prob-diff", "greater-than over years (Hanna et al. 2023)")


def _continuation(tokenizer, prompt: str, text: str) -> int | None:
    """The id of `text` when it continues `prompt` as exactly one more token, else None."""
    base = tokenizer.encode_prompt(prompt)
    longer = tokenizer.encode_prompt(prompt + text)
    return longer[-1] if len(longer) == len(base) + 1 and longer[:-1] == base else None


def _tokenizer(model: nn.Module):
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("the task generators need the model's tokenizer (anatomy.from_pretrained attaches it)")
    if model.config.arch != "decoder" or getattr(model.config, "head", "lm") != "lm":
        raise ValueError(f"the tasks score the next token: they need a decoder with an LM head; this model is "
                         f"arch={model.config.arch!r}, head={model.config.head!r}")
    return tokenizer


def _generated(model, name, pairs, n, metric, about) -> Task:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PAIRS:
        raise ValueError(f"n must be an integer from 1 to {MAX_PAIRS}, got {n!r}")
    if not pairs:
        raise ValueError(f"{name}: this tokenizer leaves no pair of equal length with single-token answers")
    task = keep_correct(model, make_task(model, name, pairs, metric=metric, about=about), n)
    return task


TASKS = {"ioi": ioi, "greater-than": greater_than, "capital-country": capital_country, "sva": subject_verb}


def build_task(model: nn.Module, name: str, n: int = 100, *, seed: int = 0) -> Task:
    """One of TASKS by name (n pairs the model gets right), or a .jsonl file of pairs."""
    if name.endswith(".jsonl"):
        return load_pairs(model, name)
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not known; allowed values: {', '.join(TASKS)}, or a .jsonl file of pairs")
    return TASKS[name](model, n, seed=seed)
