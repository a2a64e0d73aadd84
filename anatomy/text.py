"""What a text handed to a model must be, checked once, before it is tokenized.

Every way a text comes in (the tokenizer's encode, tokens, encode_prompt and chat; the analyses'
inputs; each command's TEXT; the explorer's JSON) goes through `check_text`:

- a `str`;
- every character a Unicode scalar value. A lone surrogate (U+D800 to U+DFFF) is half of a UTF-16
  pair and no character at all: JSON's "\\ud800" escape makes one, and so does Python when a shell
  passes bytes that are not UTF-8 (it keeps byte 0xff as U+DCFF, "surrogateescape"). The Rust
  tokenizers library refuses it with a TypeError that names neither the character nor where it is;
- where there is a text to analyse (not a prompt a model may start from nothing), something to
  read: not empty, and not white space alone, which no model's tokenizer turns into a token of
  the text (BERT's [CLS] [SEP] and a decoder's BOS are all that is left).

A text file given as a corpus is read through `text_lines`, which names the file and the line where
it stops being UTF-8. This module imports nothing heavy, so that the command line refuses a bad TEXT
before torch loads.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator


class InputError(ValueError):
    """An argument of a model's forward pass, or a text given to it, is not valid."""


def check_text(text, name: str = "text", *, empty: bool = False) -> str:
    """`text` itself when it is a str of Unicode characters, not empty nor only white space (unless
    `empty`); else InputError naming `name`, and for a lone surrogate the character and its position
    (0-based, in characters)."""
    if not isinstance(text, str):
        raise InputError(f"{name} must be a string, got {type(text).__name__}")
    if not empty and not text.strip():
        raise InputError(f"{name} is empty" + (" (only white space)" if text else "")
                         + ": give a text with at least one character to read")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        if 0xDC80 <= code <= 0xDCFF:  # a byte Python could not decode, kept as it came
            raise InputError(f"{name} is not valid UTF-8 (byte {code - 0xDC00:02x} at character {error.start}, "
                             f"which Python holds as the lone surrogate U+{code:04X})") from None
        raise InputError(f"{name} holds a lone surrogate, U+{code:04X}, at character {error.start}: half of a "
                         "UTF-16 pair is not a character; give valid Unicode text") from None
    return text


def text_lines(path: str | os.PathLike, newline: str | None = None) -> Iterator[str]:
    """The lines of a UTF-8 text file (a corpus, a TSV), newline kept, read one at a time; InputError
    naming the file, the line and the byte where the text stops being UTF-8 (a binary file given as
    text, a file in Latin-1), instead of the codec's words alone."""
    try:
        with open(path, encoding="utf-8", newline=newline) as handle:
            yield from handle
    except UnicodeDecodeError:
        raise InputError(_where_not_utf8(path)) from None


def text_pieces(path: str | os.PathLike, size: int = 4096) -> Iterator[str]:
    """The text of a UTF-8 file in pieces of at most `size` characters, read `size` bytes at a time, each piece
    cut after its last space or newline when one is in its second half (so a word is rarely split): a file
    that is one line of 25 MB is never in memory whole, and a reader that needs its first thousand tokens
    reads a few pieces. InputError naming the file and the byte where it stops being UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry, offset = "", 0
    with open(path, "rb") as handle:
        while True:
            raw = handle.read(size)
            try:
                text = carry + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as error:
                raise InputError(f"{os.fspath(path)} is not UTF-8 text: near byte {offset + error.start + 1:,} "
                                 f"({error.reason}); give a UTF-8 text file") from None
            offset += len(raw)
            while len(text) >= size or (not raw and text):
                piece = text[:size]
                cut = max(piece.rfind(" "), piece.rfind("\n")) + 1
                cut = cut if cut > size // 2 and (raw or len(text) > size) else len(piece)
                yield piece[:cut]
                text = text[cut:]
            carry = text
            if not raw:
                return


def _where_not_utf8(path: str | os.PathLike) -> str:
    """The first line of the file that does not decode, and the byte in it (a second pass, in bytes:
    the text reader decodes blocks of several lines, so its error cannot say which)."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return (f"{os.fspath(path)} is not UTF-8 text: line {number:,}, byte {error.start + 1} is "
                        f"0x{line[error.start]:02x} ({error.reason}); give a UTF-8 text file")
    return f"{os.fspath(path)} is not UTF-8 text; give a UTF-8 text file"


__all__ = ["InputError", "check_text", "text_lines", "text_pieces"]
