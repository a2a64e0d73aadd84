"""Seed 004's word-level tokenization and the small, seeded models the walkthrough narrates.

    text  = '<SOS> Hello World, this is Alejandro! <EOS>'
    words = sorted(set(text.split(' ')))        # the vocabulary, built from the text itself
    stoi  = {w: i for i, w in enumerate(words)}  # ['<EOS>', '<SOS>', 'Alejandro!', 'Hello', ...]
    ids   = [stoi[w] for w in text.split(' ')]   # [1, 3, 4, 6, 5, 2, 0]

The toy models are untrained: their numbers illustrate the computation, not language. They are
drawn at a readable scale (embeddings ~ N(0, 1), matrices ~ N(0, 1/fan_in), small non-zero biases
and norm gains) rather than the training initialisation (N(0, 0.02)), under which every score
would be ~1e-4 and every attention row uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import preset
from ..models import build_model

SENTENCE = "Hello World, this is Alejandro!"  # seed 004
TRANSLATION = "Hola Mundo, soy Alejandro!"  # seed 004's decoder example
SOS, EOS = "<SOS>", "<EOS>"
SEED = 0


@dataclass(frozen=True)
class WordVocab:
    """Seed 004's stoi/itos: one id per distinct whitespace-separated word."""

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


def seed004_words(text: str = SENTENCE, *, eos: bool = True) -> list[str]:
    """'<SOS> ' + text + ' <EOS>', split on single spaces (empty words dropped)."""
    full = f"{SOS} {text}" + (f" {EOS}" if eos else "")
    return [w for w in full.split(" ") if w]


def seed004_vocab(text: str = SENTENCE) -> WordVocab:
    """sorted(set(words)) of the text with its markers: seed 004's vocabulary."""
    return WordVocab(tuple(sorted(set(seed004_words(text)))))


def seq2seq_vocab(source: str = SENTENCE, target: str = TRANSLATION) -> WordVocab:
    """The source's seed-004 vocabulary (so its ids stay [1, 3, 4, 6, 5, 2, 0]), then the target's
    new words, sorted, appended after it: one vocabulary shared by encoder and decoder."""
    base = seed004_vocab(source).itos
    extra = sorted(set(seed004_words(target)) - set(base))
    return WordVocab(base + tuple(extra))


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
    """preset("toy") (d_model 4, 2 heads, d_ff 8, 2 layers, post-norm, ReLU, sinusoidal), with
    `arch` and `overrides` replaced, its weights drawn by readable_init(seed), in eval mode."""
    config = preset("toy", arch=arch, vocab_size=vocab_size, **overrides)
    return readable_init(build_model(config, seed=seed), seed)
