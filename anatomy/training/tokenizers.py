"""Tokenizers: text <-> token ids, four granularities behind one small interface.

Every kind is a Hugging Face `tokenizers.Tokenizer`, so every kind saves as one `tokenizer.json`
beside the model and loads back without anatomy:

| kind        | model (HF)  | a token is                              | lossless round trip |
|-------------|-------------|-----------------------------------------|---------------------|
| `char`      | WordLevel   | one character (every character is split)| yes (for seen chars)|
| `word`      | WordLevel   | one whitespace-separated word (seed 004)| no: spaces collapse |
| `bpe`       | BPE         | a byte-level subword (GPT-2 style)      | yes                 |
| `wordpiece` | WordPiece   | a subword, `##` marks a continuation    | no: BERT spacing    |

The special tokens are the same for every kind and come first, so their ids are fixed:
`<PAD>`=0 (fills short sequences, never attended to), `<UNK>`=1 (a token the vocabulary lacks),
`<SOS>`=2 (start of sequence: the decoder's first input), `<EOS>`=3 (end of sequence: what the model
predicts when it is done). These are seed 004's markers; seed 004's `stoi`/`itos` are `token_to_id`
and `id_to_token` below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

PAD, UNK, SOS, EOS = "<PAD>", "<UNK>", "<SOS>", "<EOS>"
SPECIAL_TOKENS = [PAD, UNK, SOS, EOS]
KINDS = ("char", "word", "bpe", "wordpiece")
# the tokens that may play each special role, anatomy's own first, then BERT's and RoBERTa's
_SPECIAL_NAMES = {
    "pad": (PAD, "[PAD]", "<pad>"),
    "unk": (UNK, "[UNK]", "<unk>"),
    "bos": (SOS, "[CLS]", "<s>"),
    "eos": (EOS, "[SEP]", "</s>"),
}
FILENAME = "tokenizer.json"


class Tokenizer:
    """One tokenizer of any kind: `encode`, `decode`, the special ids, `save(dir)` / `load(dir)`.

    Wraps a Hugging Face `tokenizers.Tokenizer` (`.hf`); `load` reads the kind off the file's
    structure, so it needs nothing but `tokenizer.json`.
    """

    def __init__(self, hf: HFTokenizer, kind: str):
        if kind not in KINDS:
            raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.hf = hf
        self.kind = kind
        # anatomy pads and truncates batches itself; a loaded file may carry its own settings
        hf.no_padding()
        hf.no_truncation()
        # role -> id; a BERT-style tokenizer.json (e.g. MiniLM's) plays the roles with its own tokens
        self.special_ids = {}
        for role, names in _SPECIAL_NAMES.items():
            found = [hf.token_to_id(n) for n in names if hf.token_to_id(n) is not None]
            if not found:
                raise ValueError(f"tokenizer has no {role} token (looked for {', '.join(names)})")
            self.special_ids[role] = found[0]

    # ---- the interface -------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text -> ids. `add_bos`/`add_eos` wrap the ids in <SOS> ... <EOS>."""
        ids = self.hf.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def encode_batch(self, texts: list[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """`encode` for many texts at once (the Rust side runs them in parallel)."""
        head = [self.bos_id] if add_bos else []
        tail = [self.eos_id] if add_eos else []
        return [head + e.ids + tail for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text. Stops at nothing: cut at <EOS> first if the ids run past it."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self.special_ids["pad"]

    @property
    def unk_id(self) -> int:
        return self.special_ids["unk"]

    @property
    def bos_id(self) -> int:
        return self.special_ids["bos"]

    @property
    def eos_id(self) -> int:
        return self.special_ids["eos"]

    @property
    def keeps_newlines(self) -> bool:
        """Whether "\\n" survives encode -> decode (char, bpe). Where it does not (word, wordpiece),
        a language-model corpus marks each line's end with <EOS> instead."""
        return self.kind in ("char", "bpe")

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.hf.id_to_token(int(i))

    # ---- persistence ---------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write `directory/tokenizer.json` (atomically); returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / FILENAME
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(self.hf.to_str(), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def from_hf(cls, hf: HFTokenizer) -> "Tokenizer":
        """Wrap a `tokenizers.Tokenizer` (e.g. `anatomy.load_tokenizer("minilm")`); the kind is read
        off its structure."""
        return cls(hf, _kind_of(json.loads(hf.to_str())))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Read a directory holding `tokenizer.json`, or the file itself.

        The kind is read off the file's structure (model type; a per-character split means `char`),
        so a `tokenizer.json` written by another library loads too (BERT's [PAD]/[CLS]/[SEP] play
        <PAD>/<SOS>/<EOS>). Raises FileNotFoundError, or ValueError if a special role has no token."""
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer at {path}")
        hf = HFTokenizer.from_file(str(path))
        return cls(hf, _kind_of(json.loads(hf.to_str())))

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


def _kind_of(data: dict) -> str:
    """Which of KINDS a serialized HF tokenizer is."""
    model_type = data["model"]["type"]
    if model_type == "BPE":
        return "bpe"
    if model_type == "WordPiece":
        return "wordpiece"
    pre = data.get("pre_tokenizer") or {}
    return "char" if pre.get("type") == "Split" else "word"


def _empty(kind: str) -> tuple[HFTokenizer, object]:
    """An untrained HF tokenizer of `kind` and the HF trainer that fills its vocabulary."""
    if kind == "char":
        hf = HFTokenizer(models.WordLevel(unk_token=UNK))
        # every character, newline included, is its own "word"
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()  # join characters back with nothing between them
        return hf, "wordlevel"
    if kind == "word":
        hf = HFTokenizer(models.WordLevel(unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return hf, "wordlevel"  # WordLevel decodes by joining words with one space
    if kind == "bpe":
        hf = HFTokenizer(models.BPE(unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        return hf, "bpe"
    if kind == "wordpiece":
        hf = HFTokenizer(models.WordPiece(unk_token=UNK))
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
    return Tokenizer(hf, kind)


def _lines(files: list[str]) -> Iterator[str]:
    """Every line of every file, newline kept (so a char vocabulary learns "\\n"), one at a time."""
    for f in files:
        with open(f, encoding="utf-8") as handle:
            yield from handle


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """`Tokenizer.load`: a directory holding `tokenizer.json`, or the file."""
    return Tokenizer.load(path)
