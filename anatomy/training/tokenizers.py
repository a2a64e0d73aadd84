"""Tokenizers: text <-> token ids, four granularities behind one small interface.

Every kind is a Hugging Face `tokenizers.Tokenizer`, so every kind saves as one `tokenizer.json`
beside the model and loads back without anatomy:

| kind        | model (HF)  | a token is                              | lossless round trip |
|-------------|-------------|-----------------------------------------|---------------------|
| `char`      | WordLevel   | one character (every character is split)| yes (for seen chars)|
| `word`      | WordLevel   | one whitespace-separated word (Armas 2024)| no: spaces collapse |
| `bpe`       | BPE         | a byte-level subword (GPT-2 style)      | yes                 |
| `wordpiece` | WordPiece   | a subword, `##` marks a continuation    | no: BERT spacing    |

The special tokens are the same for every kind and come first, so their ids are fixed:
`<PAD>`=0 (fills short sequences, never attended to), `<UNK>`=1 (a token the vocabulary lacks),
`<SOS>`=2 (start of sequence: the decoder's first input), `<EOS>`=3 (end of sequence: what the model
predicts when it is done). These are the markers of Alejandro Armas, "What are Transformers –
Understanding the Architecture End-to-End" (2024); its `stoi`/`itos` are `token_to_id` and `id_to_token`.
Each trainer returns anatomy's one Tokenizer type (anatomy.checkpoints.tokenizer), which finds these
four tokens by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend

from ..checkpoints.tokenizer import Tokenizer
from ..text import text_lines
from .choices import KINDS

PAD, UNK, SOS, EOS = "<PAD>", "<UNK>", "<SOS>", "<EOS>"
SPECIAL_TOKENS = [PAD, UNK, SOS, EOS]

__all__ = ["KINDS", "SPECIAL_TOKENS", "Tokenizer", "load_tokenizer", "train_tokenizer"]


def _empty(kind: str) -> tuple[Backend, str]:
    """An untrained HF tokenizer of `kind` and the HF trainer that fills its vocabulary."""
    if kind == "char":
        hf = Backend(models.WordLevel(unk_token=UNK))
        # every character, newline included, is its own "word"
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()  # join characters back with nothing between them
        return hf, "wordlevel"
    if kind == "word":
        hf = Backend(models.WordLevel(unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return hf, "wordlevel"  # WordLevel decodes by joining words with one space
    if kind == "bpe":
        hf = Backend(models.BPE(unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        return hf, "bpe"
    if kind == "wordpiece":
        hf = Backend(models.WordPiece(unk_token=UNK))
        hf.normalizer = normalizers.BertNormalizer(lowercase=False)
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece()
        return hf, "wordpiece"
    raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")


def train_tokenizer(
    kind: str,
    texts: Iterable[str] | None = None,
    files: list[str | os.PathLike] | None = None,
    vocab_size: int = 8000,
    min_frequency: int = 1,
) -> Tokenizer:
    """Learn a vocabulary of `kind` from `files` (streamed from disk) or from an iterable of `texts`.

    `vocab_size` bounds word/bpe/wordpiece vocabularies (char keeps every character it sees);
    `min_frequency` drops rarer words or merges. Raises ValueError when the input holds no text.
    """
    if (texts is None) == (files is None):
        raise ValueError("give exactly one of texts= or files=")
    hf, family = _empty(kind)
    common = dict(special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    if family == "wordlevel":
        unbounded = kind == "char"
        trainer = trainers.WordLevelTrainer(
            vocab_size=2**31 - 1 if unbounded else vocab_size,
            min_frequency=0 if unbounded else min_frequency, **common)
    elif family == "bpe":
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
    else:
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, **common)
    if files is not None:
        files = [str(f) for f in files]
        for f in files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"no such file: {f}")
            if Path(f).stat().st_size == 0:
                raise ValueError(f"{f} is empty: there is nothing to train on")
        hf.train_from_iterator(_lines(files), trainer)
    else:
        hf.train_from_iterator(texts, trainer)
    if hf.get_vocab_size() <= len(SPECIAL_TOKENS):
        source = ", ".join(files) if files else "the texts given"
        raise ValueError(f"cannot train a {kind} tokenizer: {source} holds no text")
    return Tokenizer(hf)


def _lines(files: list[str]) -> Iterator[str]:
    """Every line of every file, newline kept (so a char vocabulary learns "\\n"), one at a time."""
    for f in files:
        yield from text_lines(f)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """`Tokenizer.load`: a directory holding `tokenizer.json`, or the file."""
    return Tokenizer.load(path)
