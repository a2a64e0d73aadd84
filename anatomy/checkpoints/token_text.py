"""One way to show a token as text, for every tokenizer and every place a token is shown.

A tokenizer's vocabulary stores pieces in its own code: byte-level BPE (GPT-2, Llama 3, SmolLM2)
writes each byte as a printable stand-in ("Ġ" for a space, "Ċ" for a new line, "Ã©" for é);
SentencePiece (Llama 2, T5, Gemma) writes a space as "▁" and a byte it has no piece for as
"<0x0A>"; WordPiece (BERT) marks a word's continuation with "##". A reader wants the text each
token stands for, so every view, walk, analysis, terminal line and figure shows

    token_text(piece)  the text the piece stands for: "Ġcapital" -> " capital", "▁Paris" -> " Paris",
                       "<0x0A>" -> "\\n"; WordPiece's "##ing" keeps its "##" (BERT's own convention);
    visible(text)      that text with its invisible characters made visible (LEGEND):
                       " capital" -> "␣capital", "\\n" -> "↵".

Bytes that are only part of a character (an emoji split over two tokens) are shown as <0xF0>,
SentencePiece's own notation for a byte. `Tokenizer.tokens(text)` and `Tokenizer.labels(ids)`
return visible strings; `Tokenizer.token_texts(ids)` the plain text (TransformerLens's
`to_str_tokens`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache

SPACE, NEWLINE, TAB, RETURN = "␣", "↵", "⇥", "␍"
LEGEND = f"{SPACE} a space, {NEWLINE} a new line, {TAB} a tab, <0xF0> a byte that is part of a character"
_SHOWN = {" ": SPACE, "\n": NEWLINE, "\t": TAB, "\r": RETURN}
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def visible(text: str) -> str:
    """`text` with every space, new line, tab and carriage return replaced by its sign (SPACE,
    NEWLINE, TAB, RETURN), and any other control or format character (ESC, BEL, the
    right-to-left override U+202E, ...) by an escape such as \\x1b or \\u202e, so that a token can
    neither hide nor change what is printed around it."""
    out = []
    for char in text:
        if char in _SHOWN:
            out.append(_SHOWN[char])
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def legend_for(tokens) -> str | None:
    """LEGEND, for a page or a printout that shows a token with a space, a new line, a tab or a
    partial byte; None when no token shown needs it (the toys' words)."""
    signs = (SPACE, NEWLINE, TAB, RETURN, "<0x")
    return LEGEND if any(sign in token for token in tokens for sign in signs) else None


def text_of_bytes(data: bytes) -> str:
    """UTF-8 bytes as text; bytes that do not form a whole character are written <0xF0>."""
    decoded = data.decode("utf-8", errors="surrogateescape")
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in decoded)


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's stand-in character -> the byte it stands for (GPT-2's `bytes_to_unicode`):
    the 188 printable Latin-1 bytes stand for themselves; the other 68 (space, control bytes, ...)
    are shifted to U+0100 onwards, in order, so that "Ġ" (U+0120) is the space byte 0x20."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


def _from_byte_level(piece: str) -> str:
    alphabet = _byte_level_alphabet()
    if not all(c in alphabet for c in piece):
        return piece  # an added token written as plain text (e.g. "<|im_start|>")
    return text_of_bytes(bytes(alphabet[c] for c in piece))


def _from_sentencepiece(piece: str, replacement: str = "▁") -> str:
    match = _BYTE_PIECE.fullmatch(piece)
    if match:
        return text_of_bytes(bytes([int(match.group(1), 16)]))
    return piece.replace(replacement, " ")


def piece_decoder(backend_json: str) -> Callable[[str], str]:
    """piece -> the text it stands for, chosen from the tokenizer's own decoder (tokenizer.json):
    ByteLevel, Metaspace or a SentencePiece-style sequence (Replace "▁" by " ", ByteFallback), or
    the piece itself (WordPiece, WordLevel, characters)."""
    data = json.loads(backend_json)
    decoders = _flatten((data.get("decoder") or {}))
    kinds = {d.get("type") for d in decoders}
    if "ByteLevel" in kinds:
        return _from_byte_level
    replacement = next((d.get("replacement") for d in decoders if d.get("type") == "Metaspace"), None)
    if replacement is None:
        replacement = next((d["pattern"].get("String") for d in decoders if d.get("type") == "Replace"
                            and isinstance(d.get("pattern"), dict) and d.get("content") == " "), None)
    if replacement or "ByteFallback" in kinds:
        return lambda piece: _from_sentencepiece(piece, replacement or "▁")
    return lambda piece: piece


def _flatten(decoder: dict) -> list[dict]:
    if decoder.get("type") == "Sequence":
        return [d for part in decoder.get("decoders", []) for d in _flatten(part)]
    return [decoder] if decoder else []


__all__ = ["LEGEND", "NEWLINE", "SPACE", "TAB", "legend_for", "piece_decoder", "text_of_bytes", "visible"]
