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

The fitted weights ship with the package (toy_weights/, a few KB of safetensors per toy, post-norm
as in the paper and pre-norm as in GPT-2), so a toy loads in milliseconds and predicts the same on
every machine. They were written by

    python -m anatomy.checkpoints.fit_toys      # refits all six and rewrites toy_weights/

which fits each toy deterministically: weights drawn from a seed at a readable scale (embeddings
~ N(0, 1), matrices ~ N(0, 1/fan_in), so the numbers a walkthrough prints stay the size a learner
can check by hand), then full-batch Adam in float64 until every target has probability >= 0.9.
Float64 keeps the path nearly independent of the thread count and the CPU: a refit on another
machine may differ in the last bits but predicts the same words. Any other seed or architecture
override is fitted the same way when asked for (under a second), then kept for the process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing
from safetensors.torch import load_file
from torch import nn

from ..config import ModelConfig, preset
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
    unknown words -> <UNK>. With special tokens, the decoder's prompt is "<SOS> text" (what it
    continues, as GPT-style tokenizers add BOS and never EOS); an encoder's or a source's input is
    the whole "<SOS> text <EOS>", as BERT's is [CLS] text [SEP]."""
    vocab = {word: i for i, word in enumerate(toy_vocabulary(name))}
    backend = Backend(WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = WhitespaceSplit()
    specials = [SOS, EOS, UNK] + ([MASK] if MASK in vocab else [])
    backend.add_special_tokens(specials)
    single = f"{SOS} $A" if TOYS[name].arch == "decoder" else f"{SOS} $A {EOS}"
    backend.post_processor = TemplateProcessing(single=single, pair=f"{SOS} $A {EOS} $B {EOS}",
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


MAX_STEPS = 3000
LEARNING_RATE = 0.01
CONFIDENT = 0.9  # fitting stops once every target gets at least this probability
RESTARTS = 4  # a fit that is not confident after MAX_STEPS starts again from the next seed
# The variants that ship fitted: the paper's post-norm block, and GPT-2's pre-norm one (`walk --norm-position pre`).
NORM_VARIANTS = {"post": {}, "pre": {"norm_position": "pre", "final_norm": True}}
WEIGHTS = resources.files("anatomy.checkpoints") / "toy_weights"


def toy_config(name: str, **overrides) -> ModelConfig:
    """The toy's architecture: preset("toy") for its family and vocabulary, with its special ids."""
    _check_name(name)
    toy, vocab = TOYS[name], toy_vocabulary(name)
    specials = {"bos_token_id": vocab.index(SOS), "eos_token_id": vocab.index(EOS)}
    if toy.arch == "encoder-decoder":
        specials["decoder_start_token_id"] = vocab.index(SOS)  # the decoder reads <SOS> y1 y2 ...
    if toy.arch == "encoder":
        specials["head"] = "masked-lm"
    return preset("toy", arch=toy.arch, vocab_size=len(vocab), **specials, **overrides)


def fit_toy(name: str, *, seed: int = SEED, **overrides) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Fit toy `name` on its task and return (its float32 state dict, how it was fitted).

    Full-batch Adam in float64 on the cross-entropy of the task's targets, stopping once every
    target has probability >= CONFIDENT; if MAX_STEPS pass first, the fit starts again from
    seed + 1, up to RESTARTS times. Raises RuntimeError if none of them learns the task."""
    inputs, targets = task_batch(name)
    keep = targets != -100
    config = toy_config(name, **overrides)
    for attempt in range(RESTARTS):
        model = readable_init(build_model(config, seed=seed + attempt), seed + attempt).double().train()
        with torch.enable_grad():  # the caller may be inside torch.no_grad()
            steps = _fit(model, inputs, targets, keep)
        if steps is not None:
            state = {key: value.detach().float().contiguous() for key, value in model.state_dict().items()}
            return state, {"seed": str(seed + attempt), "steps": str(steps), "fitted_by": "python -m anatomy.checkpoints.fit_toys"}
    raise RuntimeError(f"the toy {name} did not learn its task from seeds {seed} to {seed + RESTARTS - 1}")


def _fit(model: nn.Module, inputs: dict, targets: torch.Tensor, keep: torch.Tensor) -> int | None:
    """Adam on the kept targets' cross-entropy until every one is CONFIDENT: the steps taken, or None."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    for step in range(MAX_STEPS):
        optimizer.zero_grad()
        logits = model(**inputs).logits
        if bool((logits.softmax(-1)[keep].gather(-1, targets[keep][:, None]) >= CONFIDENT).all()):
            return step
        F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).backward()
        optimizer.step()
    return None


def _shipped_file(name: str, seed: int, overrides: dict) -> Path | None:
    """The packaged weights for these settings, if they ship (seed 0, post- or pre-norm)."""
    variant = next((norm for norm, fields in NORM_VARIANTS.items() if fields == overrides), None)
    if seed != SEED or variant is None:
        return None
    path = Path(str(WEIGHTS / f"{name}-{variant}.safetensors"))
    return path if path.is_file() else None


@lru_cache(maxsize=None)
def _fitted_state(name: str, seed: int, overrides: tuple) -> dict[str, torch.Tensor]:
    """The toy's weights: the shipped file for the shipped settings, else a fit (kept per process)."""
    shipped = _shipped_file(name, seed, dict(overrides))
    if shipped is not None:
        return load_file(str(shipped))
    return fit_toy(name, seed=seed, **dict(overrides))[0]


def build_toy(name: str, *, seed: int = SEED, max_seq_len: int | None = None, **overrides) -> nn.Module:
    """The built-in toy `name` (one of TOY_MODELS), fitted on its task, in eval mode.

    `max_seq_len` grows the position table for longer texts (the sinusoids are a formula, so the
    fitted weights do not change); `overrides` (e.g. norm_position="pre", final_norm=True) change
    the architecture. Seed 0 in post- or pre-norm loads the shipped weights; anything else is
    fitted when first asked for. Raises ValueError for an unknown name.
    """
    _check_name(name)
    state = _fitted_state(name, seed, tuple(sorted(overrides.items())))
    sizes = {"max_seq_len": max(max_seq_len or 0, preset("toy").max_seq_len)}
    model = build_model(toy_config(name, **overrides, **sizes))
    model.load_state_dict(state)
    model.toy = TOYS[name]
    return model.eval()
