"""Text for a terminal: what never reaches one as it is, one-line messages, and folded summaries.

The command line prints paths, texts and error messages a user (or a hostile file) supplied; every one
goes through `printable` or `one_line` first, so no escape sequence or bidirectional override reaches
the terminal. `summary_block` folds a command's start-up summary to 80 columns.
"""

from __future__ import annotations

import textwrap
import unicodedata

# What never reaches a terminal as it is: control characters (Cc: C0, DEL, C1: ESC, BEL, CSI ...),
# which can clear the screen, move the cursor or retitle the window; format characters (Cf: the
# bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069, the marks U+200E/F), which
# reorder what a line shows ("Trojan Source"); lone surrogates (Cs: bytes a shell passed that are not
# UTF-8, which would fail to print); the line and paragraph separators (Zl, Zp).
UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
JOINERS = "\u200c\u200d"  # Cf, but how Persian, the Indic scripts and emoji sequences are written: kept


def _escaped(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as Python keeps it (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """Text safe for a terminal: every control character, format character (bidirectional
    overrides), lone surrogate and line separator (UNPRINTABLE) except those in `keep` shown as a
    visible escape such as \\x1b or \\u202e, so that no sequence reaches the terminal and what a line
    shows is what it holds. A byte that was not UTF-8 is shown as the byte (\\xff)."""
    return "".join(c if c in keep or c in JOINERS or unicodedata.category(c) not in UNPRINTABLE else _escaped(c)
                   for c in text)


def summary_block(title: str, rows: list[tuple[str, str]], width: int = 80) -> str:
    """A start-up summary: `title`, then one "  key        value" row each, a long value folded to
    `width` columns and continued under itself."""
    lines = [title]
    for key, value in rows:
        lines += textwrap.wrap(value, width, initial_indent=f"  {key:<11} ", subsequent_indent=" " * 14,
                               break_on_hyphens=False)
    return "\n".join(lines)


def one_line(text: str, limit: int | None = None) -> str:
    """`text` as one printable line: its lines joined by spaces, control characters escaped; past
    `limit` characters, cut and ended with how many more there were."""
    text = " ".join(str(text).splitlines())
    if limit is not None and len(text) > limit:
        return f"{printable(text[:limit])}… ({len(text) - limit:,} more characters)"
    return printable(text)


__all__ = ["JOINERS", "UNPRINTABLE", "one_line", "printable", "summary_block"]
