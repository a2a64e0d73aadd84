"""Hostile input on the command line: whatever a user types, `anatomy` answers exit 0 or one line
and exit 2 (never 1, never a traceback), no raw control character reaches the terminal, every
message is bounded, and what can be refused before a model loads is refused before it loads.

Every case runs `anatomy.cli.main` in this process. The "before loading" cases replace every
loader (toys included) with one that fails the test if called.
"""

from __future__ import annotations

import argparse
import unicodedata

import pytest

from anatomy import cli

# Characters that change what a terminal shows: ESC, BEL, CSI, DEL, the bidirectional overrides and
# isolates, the left-to-right and right-to-left marks, the line and paragraph separators.
HOSTILE = "\x1b\x07\x9b\x7f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u2028\u2029"


def test_printable_escapes_every_control_format_and_separator_character():
    shown = cli.printable("a" + HOSTILE + "b")
    assert shown.startswith("a") and shown.endswith("b")
    assert all(unicodedata.category(c) not in cli.UNPRINTABLE for c in shown), shown
    assert "\\u202e" in shown and "\\x1b" in shown and "\\u2066" in shown


def test_printable_shows_a_byte_that_was_not_utf8_as_the_byte():
    raw = b"caf\xff".decode("utf-8", "surrogateescape")  # what sys.argv holds for those bytes
    assert cli.printable(raw) == "caf\\xff"
    cli.printable(raw).encode("utf-8")  # printable text always encodes


def test_printable_keeps_text_and_what_is_asked_for():
    text = "héllo wörld, 東京, مرحبا, नमस्ते, 👩\u200d💻"  # joiners (U+200D) are how scripts and emoji are written
    assert cli.printable(text) == text
    assert cli.printable("a\nb\tc", keep="\n\t") == "a\nb\tc"
    assert cli.printable("a\nb") == "a\\x0ab"


def test_one_line_is_bounded_and_says_how_much_it_cut():
    line = cli.one_line("x" * 10_000 + "\n" + "y" * 10, limit=500)
    assert len(line) < 600 and line.endswith("… (9,511 more characters)")
    assert cli.one_line("short\nmessage", limit=500) == "short message"


@pytest.mark.parametrize("value, message", [
    ("", "an empty file name"),
    ("{tmp}", "is a folder"),
    ("{tmp}/", "is a folder"),
    ("{tmp}/view.gif", "must end in .html"),
    ("{tmp}/no/such/view.html", "does not exist"),
    ("{tmp}/file.txt/view.html", "is not a folder"),
    ("/proc/view.html", "cannot write in the folder /proc"),
    ("{tmp}/" + "v" * 300 + ".html", "File name too long"),
])
def test_an_output_file_is_checked_before_anything_runs(value, message, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    check = cli.output_file(".html", ".png")
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        check(value.replace("{tmp}", str(tmp_path)))
    assert check(str(tmp_path / "view.HTML")) == str(tmp_path / "view.HTML")
    assert not list(tmp_path.glob(".*"))  # the check leaves nothing behind


@pytest.mark.parametrize("value, message", [
    ("", "an empty folder name"),
    ("{tmp}/file.txt", "is a file"),
    ("{tmp}/file.txt/run", "cannot write in the folder|is not a folder"),
    ("/proc/run", "cannot write in the folder /proc"),
])
def test_an_output_folder_is_checked_before_anything_runs(value, message, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        cli.output_folder(value.replace("{tmp}", str(tmp_path)))
    assert cli.output_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # checked, not created


def test_a_path_in_a_refusal_is_escaped(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        cli.output_file(".html")(str(tmp_path / "no\x1b]0;PWNED\x07\u202e" / "v.html"))
    assert not set(str(refused.value)) & set(HOSTILE)
