"""The built-in toy models: tiny Transformers that have learned one small task each.

Alejandro Armas, "What are Transformers – Understanding the Architecture End-to-End" (2024), builds
its vocabulary from one sentence:

    text  = '<SOS> Hello World, this is Alejandro! <EOS>'
    words = sorted(set(text.split(' ')))        # ['<EOS>', '<SOS>', 'Alejandro!', 'Hello', ...]
    stoi  = {w: i for i, w in enumerate(words)}  # ids [1, 3, 4, 6, 5, 2, 0]

and uses the article's sizes (d_model 4, 2 heads, d_ff 8, 2 layers). Each toy keeps those ids and
appends the words its task needs, then `<UNK>` for any other word:

    toy          decoder          predicts each next word of the sentence ("is" -> "Alejandro!")
    toy-encoder  encoder (MLM)    fills in one masked word of the sentence ("<MASK>" -> "is")
    toy-seq2seq  encoder-decoder  translates it: "Hello World, this is Alejandro!" -> "Hola Mundo, soy Alejandro!"

Each is fitted deterministically (seeded weights, full-batch Adam for a fixed number of steps, a
second or so on one thread) the first time it is asked for, then kept in memory for the process.
The weights start at a readable scale (embeddings ~ N(0, 1), matrices ~ N(0, 1/fan_in)), so the
numbers a walkthrough prints stay the size a learner can check by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing
from torch import nn

from ..config import preset
from ..models import build_model
from .tokenizer import Tokenizer

SENTENCE = "Hello World, this is Alejandro!"
TRANSLATION = "Hola Mundo, soy Alejandro!"
SOS, EOS, UNK, MASK = "<SOS>", "<EOS>", "<UNK>", "<MASK>"
TOY_MODELS = ("toy", "toy-encoder", "toy-seq2seq")
SEED = 0

# The tiny translation task: the sentence, and its two halves, so that the decoder must read the source.
PAIRS = (
    (SENTENCE, TRANSLATION),
    ("Hello World,", "Hola Mundo,"),
    ("this is Alejandro!", "soy Alejandro!"),
)


@dataclass(frozen=True)
class Toy:
    """What a toy is for: its architecture, the task it learned (in words), and its default text."""

    arch: str
    task: str
    text: str
    target: str | None = None


TOYS = {
    "toy": Toy("decoder", f"predict each next word of “{SENTENCE}” (the article's sentence)", SENTENCE),
    "toy-encoder": Toy("encoder", f"fill in a masked word ({MASK}) of “{SENTENCE}”", "Hello World, this <MASK> Alejandro!"),
    "toy-seq2seq": Toy("encoder-decoder", f"translate “{SENTENCE}” into “{TRANSLATION}” (and its two halves)",
                       SENTENCE, TRANSLATION),
}


def _words(text: str) -> list[str]:
    return [w for w in text.split(" ") if w]


def article_words(text: str = SENTENCE, *, eos: bool = True) -> list[str]:
    """'<SOS> ' + text + ' <EOS>', split on single spaces (empty words dropped)."""
    return [SOS] + _words(text) + ([EOS] if eos else [])


@dataclass(frozen=True)
class WordVocab:
    """The article's stoi/itos for any text: one id per distinct whitespace-separated word
    (used where an untrained toy is drawn for an arbitrary text)."""

    itos: tuple[str, ...]

    @property
    def stoi(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.itos)}

    def encode(self, words: list[str]) -> list[int]:
        stoi = self.stoi
        unknown = [w for w in words if w not in stoi]
        if unknown:
            raise KeyError(f"words {unknown} are not in the vocabulary {list(self.itos)}")
        return [stoi[w] for w in words]

    def decode(self, ids: list[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def __len__(self) -> int:
        return len(self.itos)


def sentence_vocab(text: str = SENTENCE) -> WordVocab:
    """sorted(set(words)) of the text with its markers: the article's vocabulary."""
    return WordVocab(tuple(sorted(set(article_words(text)))))


def seq2seq_vocab(source: str = SENTENCE, target: str = TRANSLATION) -> WordVocab:
    """The source's vocabulary (so its ids stay [1, 3, 4, 6, 5, 2, 0]), then the target's new
    words, sorted, appended after it: one vocabulary shared by encoder and decoder."""
    base = sentence_vocab(source).itos
    extra = sorted(set(article_words(target)) - set(base))
    return WordVocab(base + tuple(extra))


def toy_vocabulary(name: str) -> tuple[str, ...]:
    """The toy's words in id order: the article's seven, then its task's, then <UNK>."""
    _check_name(name)
    base = tuple(sorted(set(article_words(SENTENCE))))
    extra = {"toy": (), "toy-encoder": (MASK,), "toy-seq2seq": tuple(sorted(set(_words(TRANSLATION)) - set(base)))}
    return base + extra[name] + (UNK,)


def toy_backend(name: str) -> Backend:
    """A `tokenizers.Tokenizer` for the toy: WordLevel over its vocabulary, split on whitespace,
    unknown words -> <UNK>, and "<SOS> text <EOS>" when special tokens are added."""
    vocab = {word: i for i, word in enumerate(toy_vocabulary(name))}
    backend = Backend(WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = WhitespaceSplit()
    specials = [SOS, EOS, UNK] + ([MASK] if MASK in vocab else [])
    backend.add_special_tokens(specials)
    backend.post_processor = TemplateProcessing(single=f"{SOS} $A {EOS}", pair=f"{SOS} $A {EOS} $B {EOS}",
                                                special_tokens=[(SOS, vocab[SOS]), (EOS, vocab[EOS])])
    return backend


def toy_tokenizer(name: str) -> Tokenizer:
    """The toy's tokenizer, as anatomy's one Tokenizer type (built on toy_backend)."""
    backend = toy_backend(name)
    eos = toy_vocabulary(name).index(EOS)
    return Tokenizer(backend, pad_id=eos)  # the article has no padding token: rows are padded with <EOS>


def readable_init(model: nn.Module, seed: int = SEED) -> nn.Module:
    """Redraw every parameter at a readable scale, deterministically from `seed`.

    Matrices ~ N(0, 1/fan_in) (embedding tables ~ N(0, 1)); biases ~ N(0, 0.1^2); norm gains
    ~ 1 + N(0, 0.1^2). Buffers (the sinusoid table, rotary angles) are formulas and stay as they are.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if param.dim() >= 2:
                std = 1.0 if "embedding" in name else 1.0 / math.sqrt(param.shape[1])
                param.copy_(noise * std)
            elif "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.1 * noise)
    return model.eval()


def toy_model(vocab_size: int = 7, *, arch: str = "decoder", seed: int = SEED, **overrides) -> nn.Module:
    """An untrained toy: preset("toy") with `arch` and `overrides` replaced, drawn by readable_init."""
    config = preset("toy", arch=arch, vocab_size=vocab_size, **overrides)
    return readable_init(build_model(config, seed=seed), seed)


# The tasks: one padded batch each, targets -100 where nothing is predicted -----------------------

def _ids(name: str, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word lists -> (ids [N, T] padded with <EOS>, padding_mask [N, T], True = a real word)."""
    stoi = {w: i for i, w in enumerate(toy_vocabulary(name))}
    width = max(len(words) for words in sentences)
    ids = torch.full((len(sentences), width), stoi[EOS])
    mask = torch.zeros(len(sentences), width, dtype=torch.bool)
    for row, words in enumerate(sentences):
        ids[row, : len(words)] = torch.tensor([stoi.get(w, stoi[UNK]) for w in words])
        mask[row, : len(words)] = True
    return ids, mask


def task_batch(name: str) -> tuple[dict, torch.Tensor]:
    """The toy's training set as (the model's keyword inputs, targets [N, T] with -100 = ignored)."""
    _check_name(name)
    if name == "toy":
        ids, _ = _ids(name, [article_words(SENTENCE)])
        return {"input_ids": ids[:, :-1]}, ids[:, 1:]
    if name == "toy-encoder":
        words = article_words(SENTENCE)
        positions = range(1, len(words) - 1)  # every word, never the markers
        full, _ = _ids(name, [words] * len(positions))
        masked, _ = _ids(name, [words[:i] + [MASK] + words[i + 1:] for i in positions])
        targets = torch.full_like(full, -100)
        for row, i in enumerate(positions):
            targets[row, i] = full[row, i]
        return {"input_ids": masked}, targets
    source, source_mask = _ids(name, [article_words(s) for s, _ in PAIRS])
    target, target_mask = _ids(name, [article_words(t) for _, t in PAIRS])
    targets = target[:, 1:].masked_fill(~target_mask[:, 1:], -100)
    return {"src_ids": source, "tgt_ids": target[:, :-1], "src_padding_mask": source_mask,
            "tgt_padding_mask": target_mask[:, :-1]}, targets


def _check_name(name: str) -> None:
    if name not in TOY_MODELS:
        raise ValueError(f"unknown toy {name!r}; choose one of {', '.join(TOY_MODELS)}")


MAX_STEPS = 1500
LEARNING_RATE = 0.03
CONFIDENT = 0.9  # fitting stops once every target gets at least this probability


@lru_cache(maxsize=None)
def _fitted_state(name: str, seed: int, overrides: tuple) -> dict[str, torch.Tensor]:
    """Fit the toy on its task (full batch, Adam) until every target is predicted with probability
    >= CONFIDENT (at most MAX_STEPS steps), and return its parameters. Deterministic: the same
    seed takes the same path."""
    toy = TOYS[name]
    model = toy_model(len(toy_vocabulary(name)), arch=toy.arch, seed=seed,
                      **({"head": "masked-lm"} if toy.arch == "encoder" else {}), **dict(overrides))
    inputs, targets = task_batch(name)
    model.train()
    keep = targets != -100
    with torch.enable_grad():  # the caller may be inside torch.no_grad()
        _fit(model, inputs, targets, keep)
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _fit(model: nn.Module, inputs: dict, targets: torch.Tensor, keep: torch.Tensor) -> None:
    """Full-batch Adam on the cross-entropy of the kept targets, until every one is CONFIDENT."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    for _ in range(MAX_STEPS):
        optimizer.zero_grad()
        logits = model(**inputs).logits
        if bool((logits.softmax(-1)[keep].gather(-1, targets[keep][:, None]) >= CONFIDENT).all()):
            break
        F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).backward()
        optimizer.step()


def build_toy(name: str, *, seed: int = SEED, max_seq_len: int | None = None, **overrides) -> nn.Module:
    """The built-in toy `name` (one of TOY_MODELS), fitted on its task, in eval mode.

    `max_seq_len` grows the position table for longer texts (the sinusoids are a formula, so the
    fitted weights do not change); `overrides` (e.g. norm_position="pre", final_norm=True) change
    the architecture, and the toy is fitted again for it. Raises ValueError for an unknown name.
    """
    _check_name(name)
    toy = TOYS[name]
    state = _fitted_state(name, seed, tuple(sorted(overrides.items())))
    sizes = {"max_seq_len": max(max_seq_len or 0, preset("toy").max_seq_len)}
    model = build_model(preset("toy", arch=toy.arch, vocab_size=len(toy_vocabulary(name)),
                               **({"head": "masked-lm"} if toy.arch == "encoder" else {}), **overrides, **sizes))
    model.load_state_dict(state)
    model.toy = toy
    return model.eval()
