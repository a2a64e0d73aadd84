"""The classic tasks, built with each model's own tokenizer, keeping only the pairs the model gets right.

    ioi              "When Mary and John went to the store, John gave a drink to" -> " Mary" (Wang et al. 2022)
    greater-than     "The war lasted from the year 1732 to the year 17" -> a later year (Hanna et al. 2023)
    capital-country  "The capital of France is" -> " Paris"
    sva              "The key near the table" -> " is" (subject-verb agreement)

Each generator makes 3n candidate pairs from a seeded generator, runs the model on the clean prompts in
chunks until n of them score above 0, and says how many it dropped (tasks.keep_correct).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from torch import nn

from ...checkpoints.files import shorten
from .tasks import MAX_PAIRS, Task, keep_correct, load_pairs, make_task

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
    tokenizer = _tokenizer(model, n, seed)
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
    tokenizer = _tokenizer(model, n, seed)
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
    tokenizer = _tokenizer(model, n, seed)
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
    tokenizer = _tokenizer(model, n, seed)
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


def _tokenizer(model: nn.Module, n, seed):
    """The model's tokenizer, after checking n and seed: nothing is generated for a count out of range."""
    _check_count(n)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {shorten(repr(seed), 80)}")
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise ValueError(f"model must be an anatomy model (anatomy.from_pretrained); got {type(model).__name__}")
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("the task generators need the model's tokenizer (anatomy.from_pretrained attaches it)")
    if model.config.arch != "decoder" or getattr(model.config, "head", "lm") != "lm":
        raise ValueError(f"the tasks score the next token: they need a decoder with an LM head; this model is "
                         f"arch={model.config.arch!r}, head={model.config.head!r}")
    return tokenizer


def _check_count(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PAIRS:
        raise ValueError(f"n must be an integer from 1 to {MAX_PAIRS}, got {shorten(repr(n), 80)}")


def _generated(model, name, pairs, n, metric, about) -> Task:
    if not pairs:
        raise ValueError(f"{name}: this tokenizer leaves no pair of equal length with single-token answers")
    task = keep_correct(model, make_task(model, name, pairs, metric=metric, about=about), n)
    return task


TASKS = {"ioi": ioi, "greater-than": greater_than, "capital-country": capital_country, "sva": subject_verb}


def build_task(model: nn.Module, name: str, n: int = 100, *, seed: int = 0) -> Task:
    """One of TASKS by name, or a .jsonl file of pairs: n pairs the model gets right either way (of a file, the
    first n right among its first 3n, as a generator makes 3n candidates; task.dropped counts the others)."""
    if not isinstance(name, str):
        raise ValueError(f"task must be a name or a .jsonl path, got {type(name).__name__}")
    if name.endswith(".jsonl"):
        _check_count(n)
        _tokenizer(model, n, seed)
        return keep_correct(model, load_pairs(model, name, limit=min(MAX_PAIRS, 3 * n)), n)
    if name not in TASKS:
        raise ValueError(f"task {shorten(repr(name), 80)} is not known; allowed values: {', '.join(TASKS)}, or a .jsonl "
                         "file of pairs")
    return TASKS[name](model, n, seed=seed)
