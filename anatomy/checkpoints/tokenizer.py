"""One tokenizer type for every model anatomy opens: text <-> token ids.

Built on Hugging Face `tokenizers` (the Rust library behind transformers' fast tokenizers), never
hand-written; the `tokenizers.Tokenizer` underneath is `.backend`. Every loader returns this type:
checkpoint folders (tokenizer.json, BERT's vocab.txt, GPT-2's vocab.json + merges.txt), anatomy's
trainers (char / word / BPE / WordPiece), GGUF files and the toy models.

    tok = anatomy.load_tokenizer("minilm")
    tok.encode("Hello world")          # [101, 7592, 2088, 102]   (the model's special tokens added)
    tok.tokens("Hello world")          # ['[CLS]', 'hello', 'world', '[SEP]']
    gpt2.tokens("The capital")         # ['The', '␣capital']: each token as text (token_text.py)
    ids, padding_mask = tok(["a", "a longer text"])   # (B, T) long, (B, T) bool, True = real token

Five special roles, each an id or None: bos (begin of sequence; anatomy's <SOS>, BERT's [CLS]),
eos (end; <EOS>, [SEP]), pad (fills short rows, never attended to), unk (a token the vocabulary
lacks) and mask (what a masked-language model fills in: [MASK]). A folder's tokenizer_config.json names them; otherwise the first conventional name that the
vocabulary has plays the role.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer as Backend
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

from ..inputs import pad_batch
from ..text import InputError, check_text
from .chat import render_chat, turn_end
from .files import CheckpointError, read_json, shorten
from .token_text import piece_decoder, visible
from .writing import write_atomically

ROLES = ("bos", "eos", "pad", "unk", "mask")
# role -> the tokens that conventionally play it: anatomy's own first, then BERT's, RoBERTa's, GPT-2's.
CONVENTIONAL = {
    "bos": ("<SOS>", "[CLS]", "<s>", "<|endoftext|>"),
    "eos": ("<EOS>", "[SEP]", "</s>", "<|endoftext|>"),
    "pad": ("<PAD>", "[PAD]", "<pad>"),
    "unk": ("<UNK>", "[UNK]", "<unk>"),
    "mask": ("<MASK>", "[MASK]", "<mask>"),
}
TOKENIZER_FILE, SETTINGS_FILE = "tokenizer.json", "tokenizer_config.json"
# transformers writes model_max_length = 1e30 when a tokenizer has no limit.
_NO_LIMIT = 1_000_000


class Tokenizer:
    """Text <-> ids for one vocabulary, with its special ids and (for chat models) its chat template.

    backend: a `tokenizers.Tokenizer`. bos_id/eos_id/pad_id/unk_id: the special ids; None looks the
    role up by its conventional token names. max_length: the longest row `__call__` returns.
    """

    def __init__(self, backend: Backend, *, bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None, mask_id: int | None = None, chat_template: str | None = None,
                 max_length: int | None = None):
        self.backend = backend
        # Padding and truncation are done here, per call, not by settings a file may carry.
        backend.no_padding()
        backend.no_truncation()
        given = {"bos": bos_id, "eos": eos_id, "pad": pad_id, "unk": unk_id, "mask": mask_id}
        self.special_ids: dict[str, int | None] = {}
        for role in ROLES:
            known = [i for i in (self.token_to_id(name) for name in CONVENTIONAL[role]) if i is not None]
            self.special_ids[role] = given[role] if given[role] is not None else (known[0] if known else None)
        self.chat_template = chat_template
        self.max_length = max_length
        self._truncating_copies: dict[int, Backend] = {}
        self._piece_text = piece_decoder(backend.to_str())
        self._added = {i: token.content for i, token in backend.get_added_tokens_decoder().items()}
        self._texts: dict[int, str] = {}  # id -> token_text, filled as ids are shown

    # ---- text -> ids -----------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True, *, add_bos: bool = False,
               add_eos: bool = False) -> list[int]:
        """Text -> ids. add_special_tokens: the model's own template (BERT's [CLS] ... [SEP]);
        add_bos / add_eos: wrap the ids in bos ... eos (anatomy's <SOS> ... <EOS>) explicitly."""
        return self.encode_batch([text], add_special_tokens, add_bos=add_bos, add_eos=add_eos)[0]

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True, *, add_bos: bool = False,
                     add_eos: bool = False, max_length: int | None = None, prompt: bool = False) -> list[list[int]]:
        """`encode` for many texts at once (the Rust side runs them in parallel). max_length cuts
        the text, not the template: BERT's final [SEP] stays. prompt: see `encode_prompt`.
        Raises InputError (a ValueError) for a text that is not a str of Unicode characters (a lone
        surrogate, named with its position: anatomy.text.check_text)."""
        if isinstance(texts, str):
            raise InputError("encode_batch takes a list of texts, got one str (use encode)")
        texts = [check_text(t, "text" if len(texts) == 1 else f"texts[{i}]", empty=True) for i, t in enumerate(texts)]
        head = [self._required("bos")] if add_bos else []
        tail = [self._required("eos")] if add_eos else []
        backend = self.backend if max_length is None else self._truncating(max_length)
        try:
            encodings = backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        except BaseException as error:  # a panic in the Rust library (a PanicException) is no Exception
            if type(error).__name__ != "PanicException":
                raise
            raise CheckpointError(f"this tokenizer failed inside the Rust tokenizers library: {str(error)[:200]} "
                                  "(a pre-tokenizer regex that backtracks without end does this)") from None
        rows = []
        for e in encodings:
            ids = e.ids
            if prompt and ids and e.special_tokens_mask[-1] and ids[-1] == self.eos_id:
                ids = ids[:-1]  # the template closed the text; a prompt goes on
            rows.append(head + ids + tail)
        return rows

    def encode_prompt(self, text: str) -> list[int]:
        """The ids a decoder continues from: the tokenizer's own template at the start (Llama's
        BOS, anatomy's <SOS>), and never an end-of-sequence token at the end that the template
        would close the text with, since a prompt is not finished: the toy's "Hello World, this"
        -> <SOS> Hello World, this."""
        return self.encode_batch([text], prompt=True)[0]

    def encode_target(self, text: str, decoder_start_token_id: int | None = None) -> list[int]:
        """An encoder-decoder's decoder input: its start token, then the text without a template
        (Marian, T5 and BART start from their config's decoder_start_token_id; None uses this
        tokenizer's BOS). Raises ValueError when there is no start token."""
        start = decoder_start_token_id if decoder_start_token_id is not None else self.bos_id
        if start is None:
            raise ValueError("no decoder start token: the model's config names no decoder_start_token_id and the "
                             "tokenizer has no BOS")
        return [start] + self.encode(text, add_special_tokens=False)

    # ---- chat ----------------------------------------------------------------------------------
    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """The conversation `messages` ([{"role", "content"}, ...]) written in this checkpoint's own
        chat format (chat.py), ending with the assistant's header when add_generation_prompt.
        Raises ChatError (a ValueError) without a template or for malformed messages."""
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self._special_text("bos"), eos_token=self._special_text("eos"))

    def encode_chat(self, messages) -> list[int]:
        """The ids of `apply_chat_template(messages)`: the template writes its own special tokens, so
        none are added (as transformers does)."""
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    def turn_end_ids(self) -> list[int]:
        """The ids that end an answer: the template's end of turn when it is one token (SmolLM2's
        <|im_end|>), and EOS."""
        end = turn_end(self.chat_template, self._special_text("bos"), self._special_text("eos"))
        ids = self.encode(end, add_special_tokens=False) if end else []
        found = [ids[0]] if len(ids) == 1 else []
        return found + [self.eos_id] if self.eos_id is not None and self.eos_id not in found else found

    def _special_text(self, role: str) -> str | None:
        i = self.special_ids[role]
        return None if i is None else self.id_to_token(i)

    def encode_for(self, config, text: str, target: str | None = None) -> tuple[list[int], list[int] | None]:
        """(ids, target ids or None) as a model of this `config` (a ModelConfig) reads them: a
        decoder's text as a prompt (`encode_prompt`), an encoder's or a source with the whole
        template, an encoder-decoder's target from its decoder start token (`encode_target`)."""
        if config.arch == "decoder":
            return self.encode_prompt(text), None
        if config.arch == "encoder-decoder" and target is not None:
            return self.encode(text), self.encode_target(target, config.decoder_start_token_id)
        return self.encode(text), None

    def _truncating(self, max_length: int) -> Backend:
        """A copy of the backend that cuts every text to max_length ids (kept, one per length)."""
        if max_length not in self._truncating_copies:
            copy = Backend.from_str(self.backend.to_str())
            copy.enable_truncation(max_length)
            self._truncating_copies[max_length] = copy
        return self._truncating_copies[max_length]

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[str]:
        """The tokens `encode` gives, each shown as text (`labels`): "The capital" -> ['The', '␣capital']."""
        return self.labels(self.encode(text, add_special_tokens))

    def __call__(self, texts: str | Sequence[str], padding_side: str = "right", add_special_tokens: bool = True,
                 prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A padded batch: (ids [B, T] long, padding_mask [B, T] bool, True = real token).

        Each row is cut to `max_length` (the model's limit) when the tokenizer has one; padding goes
        on the right (encoders, training) or the left (prompts for generation). prompt: each row
        as `encode_prompt` gives it."""
        rows = self.encode_batch([texts] if isinstance(texts, str) else list(texts), add_special_tokens,
                                 max_length=self.max_length, prompt=prompt)
        return self.pad(rows, padding_side)

    def pad(self, rows: Sequence[Sequence[int]], padding_side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ids -> (ids [B, T], padding_mask [B, T]), filled with the pad id (else eos, else 0)."""
        filler = next((i for i in (self.pad_id, self.eos_id) if i is not None), 0)  # masked out anyway
        return pad_batch(rows, filler, side=padding_side)

    # ---- ids -> text -----------------------------------------------------------------------------
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text; special tokens are left out unless skip_special_tokens=False."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str | None:
        """The vocabulary's own piece for id i ("Ġcapital"), None for an unknown id; to show a token,
        use `labels`."""
        return self.backend.id_to_token(int(i))

    def token_texts(self, ids: Iterable[int]) -> list[str]:
        """The text each token stands for, one token at a time: byte-level "Ġcapital" -> " capital",
        SentencePiece "▁Paris" -> " Paris", "<0x0A>" -> "\\n" (token_text.py); special tokens as they
        are. An id outside the vocabulary is written <id 123>."""
        texts = []
        for i in ids:
            i = int(i)
            if i not in self._texts:
                piece = self.backend.id_to_token(i)
                self._texts[i] = (self._added[i] if i in self._added else
                                  f"<id {i}>" if piece is None else self._piece_text(piece))
            texts.append(self._texts[i])
        return texts

    def labels(self, ids: Iterable[int]) -> list[str]:
        """Each token as it is shown everywhere in anatomy: its text (`token_texts`) with spaces,
        new lines and control characters made visible ("␣capital", "↵"; token_text.LEGEND)."""
        return [visible(text) for text in self.token_texts(ids)]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # ---- what the vocabulary holds ---------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return self.special_ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.special_ids["eos"]

    @property
    def pad_id(self) -> int | None:
        return self.special_ids["pad"]

    @property
    def unk_id(self) -> int | None:
        return self.special_ids["unk"]

    @property
    def mask_id(self) -> int | None:
        """A masked-language model's mask token ([MASK], <mask>, the toy's <MASK>), or None."""
        return self.special_ids["mask"]

    @property
    def mask_token(self) -> str | None:
        return None if self.mask_id is None else self.id_to_token(self.mask_id)

    @property
    def kind(self) -> str:
        """The tokenization model: "bpe", "wordpiece", "unigram", or for WordLevel "char" (every
        character split off) or "word"."""
        data = json.loads(self.backend.to_str())
        model_type = data["model"]["type"]
        if model_type != "WordLevel":
            return model_type.lower()
        return "char" if (data.get("pre_tokenizer") or {}).get("type") == "Split" else "word"

    @property
    def keeps_newlines(self) -> bool:
        """Whether "\\n" survives encode -> decode. Where it does not (word, WordPiece), a
        language-model corpus marks each line's end with eos instead."""
        return self.decode(self.encode("\n", add_special_tokens=False)) == "\n"

    def _required(self, role: str) -> int:
        if self.special_ids[role] is None:
            raise ValueError(f"this tokenizer has no {role} token (looked for {', '.join(CONVENTIONAL[role])})")
        return self.special_ids[role]

    # ---- files -----------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json and tokenizer_config.json (special tokens, chat template) to
        `directory`, each atomically; transformers' AutoTokenizer reads them too. Returns the folder."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        settings = {"tokenizer_class": "PreTrainedTokenizerFast"}
        settings.update({f"{role}_token": self.id_to_token(i) for role, i in self.special_ids.items() if i is not None})
        if self.chat_template is not None:
            settings["chat_template"] = self.chat_template
        if self.max_length is not None:
            settings["model_max_length"] = self.max_length
        write_atomically(out / TOKENIZER_FILE, self.backend.to_str())
        write_atomically(out / SETTINGS_FILE, json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """A tokenizer.json file, or a folder holding tokenizer.json, vocab.txt (BERT WordPiece) or
        vocab.json + merges.txt (GPT-2 byte-level BPE), with its tokenizer_config.json if present.

        Raises CheckpointError naming the file when none is there or a file is malformed."""
        path = Path(path)
        if path.is_file():
            return cls(_read_backend(path))
        if not path.is_dir():
            raise CheckpointError(f"no tokenizer at {str(path)!r}: neither a tokenizer.json file nor a folder")
        settings = read_json(path / SETTINGS_FILE, "tokenizer settings") if (path / SETTINGS_FILE).is_file() else {}
        backend = _folder_backend(path, settings)
        specials = _special_tokens(path, settings)
        ids = {}
        for role in ROLES:
            token = specials.get(role)
            if token is not None and backend.token_to_id(token) is None:
                raise CheckpointError(f"{str(path / SETTINGS_FILE)!r} names {role}_token {token!r}, which the vocabulary lacks")
            ids[f"{role}_id"] = backend.token_to_id(token) if token is not None else None
        limit = settings.get("model_max_length")
        return cls(backend, **ids, chat_template=_chat_template(path, settings),
                   max_length=limit if isinstance(limit, int) and 0 < limit < _NO_LIMIT else None)

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


def _read_backend(path: Path) -> Backend:
    try:
        return Backend.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for every malformed file
        raise CheckpointError(f"tokenizer file {str(path)!r} is malformed: {str(error)[:200]}") from None


def _folder_backend(directory: Path, settings: dict) -> Backend:
    if (directory / TOKENIZER_FILE).is_file():
        return _read_backend(directory / TOKENIZER_FILE)
    try:
        if (directory / "vocab.txt").is_file():
            lowercase = settings.get("do_lower_case", True)
            return Backend.from_str(BertWordPieceTokenizer(
                str(directory / "vocab.txt"), lowercase=bool(lowercase), strip_accents=settings.get("strip_accents"),
            ).to_str())
        if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            return Backend.from_str(ByteLevelBPETokenizer(
                str(directory / "vocab.json"), str(directory / "merges.txt")).to_str())
    except Exception as error:  # a malformed vocabulary file
        raise CheckpointError(f"the vocabulary files in {str(directory)!r} are malformed: {str(error)[:200]}") from None
    raise CheckpointError(
        f"no tokenizer in {str(directory)!r}: expected tokenizer.json, vocab.txt (WordPiece) "
        "or vocab.json + merges.txt (byte-level BPE)"
    )


def _special_tokens(directory: Path, settings: dict) -> dict[str, str]:
    """role -> token text, from tokenizer_config.json, else special_tokens_map.json. A value is a
    string or transformers' {"content": ...} form."""
    found = {}
    sources = [settings]
    if (directory / "special_tokens_map.json").is_file():
        sources.append(read_json(directory / "special_tokens_map.json", "special tokens map"))
    for role in ROLES:
        for source in sources:
            value = source.get(f"{role}_token")
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                found[role] = value
                break
    return found


def _chat_template(directory: Path, settings: dict) -> str | None:
    """The Jinja chat template: chat_template.jinja, or tokenizer_config.json's "chat_template" (a
    string, or a list of {"name", "template"} of which "default" is taken). CheckpointError naming
    the file for a template that is not UTF-8 text, or not a string."""
    if (directory / "chat_template.jinja").is_file():
        try:
            return (directory / "chat_template.jinja").read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise CheckpointError(f"{str(directory / 'chat_template.jinja')!r} is not UTF-8 text ({error.reason} at "
                                  f"byte {error.start})") from None
    template = settings.get("chat_template")
    if isinstance(template, list):
        named = {}
        for i, entry in enumerate(template):  # transformers' list of {"name", "template"}, every entry checked
            if (not isinstance(entry, dict) or not isinstance(entry.get("name"), str)
                    or not isinstance(entry.get("template"), str) or entry["name"] in named):
                raise CheckpointError(f"{str(directory / SETTINGS_FILE)!r} has a malformed chat_template entry "
                                      f"[{i}]: {shorten(repr(entry), 120)}; each must be "
                                      '{"name": a string of its own, "template": a string}')
            named[entry["name"]] = entry["template"]
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{str(directory / SETTINGS_FILE)!r} has a chat_template that is a "
                              f"{type(template).__name__}; it must be a string, or a list of "
                              '{"name", "template"} whose "default" template is a string')
    return template
