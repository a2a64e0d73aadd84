"""Hostile input on the command line: whatever a user types, `anatomy` answers exit 0 or one line
and exit 2 (never 1, never a traceback), no raw control character reaches the terminal, every
message is bounded, and what can be refused before a model loads is refused before it loads.

Every case runs `anatomy.cli.main` in this process. The "before loading" cases replace every
loader (toys included) with one that fails the test if called.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import unicodedata

import pytest

from test_cli import run as run_anatomy  # (exit status, stdout, stderr) of `anatomy argv`, in this process

from anatomy import arguments, cli, terminal

# Characters that change what a terminal shows: ESC, BEL, CSI, DEL, the bidirectional overrides and
# isolates, the left-to-right and right-to-left marks, the line and paragraph separators.
HOSTILE = "\x1b\x07\x9b\x7f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u2028\u2029"


def test_printable_escapes_every_control_format_and_separator_character():
    shown = terminal.printable("a" + HOSTILE + "b")
    assert shown.startswith("a") and shown.endswith("b")
    assert all(unicodedata.category(c) not in terminal.UNPRINTABLE for c in shown), shown
    assert "\\u202e" in shown and "\\x1b" in shown and "\\u2066" in shown


def test_printable_shows_a_byte_that_was_not_utf8_as_the_byte():
    raw = b"caf\xff".decode("utf-8", "surrogateescape")  # what sys.argv holds for those bytes
    assert terminal.printable(raw) == "caf\\xff"
    terminal.printable(raw).encode("utf-8")  # printable text always encodes


def test_printable_keeps_text_and_what_is_asked_for():
    text = "héllo wörld, 東京, مرحبا, नमस्ते, 👩\u200d💻"  # joiners (U+200D) are how scripts and emoji are written
    assert terminal.printable(text) == text
    assert terminal.printable("a\nb\tc", keep="\n\t") == "a\nb\tc"
    assert terminal.printable("a\nb") == "a\\x0ab"


def test_one_line_is_bounded_and_says_how_much_it_cut():
    line = terminal.one_line("x" * 10_000 + "\n" + "y" * 10, limit=500)
    assert len(line) < 600 and line.endswith("… (9,511 more characters)")
    assert terminal.one_line("short\nmessage", limit=500) == "short message"


@pytest.mark.parametrize("value, message", [
    ("", "an empty file name"),
    ("{tmp}", "is a folder"),
    ("{tmp}/", "is a folder"),
    ("{tmp}/view.gif", "must end in .html"),
    ("{tmp}/no/such/view.html", "does not exist"),
    ("{tmp}/file.txt/view.html", "is not a folder"),
    ("/proc/view.html", "no file can be created in /proc"),
    ("{tmp}/" + "v" * 300 + ".html", "File name too long"),
])
def test_an_output_file_is_checked_before_anything_runs(value, message, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    check = arguments.output_file(".html", ".png")
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        check(value.replace("{tmp}", str(tmp_path)))
    assert check(str(tmp_path / "view.HTML")) == str(tmp_path / "view.HTML")
    assert not list(tmp_path.glob(".*"))  # the check leaves nothing behind


@pytest.mark.parametrize("value, message", [
    ("", "an empty folder name"),
    ("{tmp}/file.txt", "is a file"),
    ("{tmp}/file.txt/run", "no file can be created in|is not a folder"),
    ("/proc/run", "no file can be created in /proc"),
])
def test_an_output_folder_is_checked_before_anything_runs(value, message, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        arguments.output_folder(value.replace("{tmp}", str(tmp_path)))
    assert arguments.output_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # checked, not created


def test_a_path_in_a_refusal_is_escaped(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        arguments.output_file(".html")(str(tmp_path / "no\x1b]0;PWNED\x07\u202e" / "v.html"))
    assert not set(str(refused.value)) & set(HOSTILE)


# Running anatomy -------------------------------------------------------------------------------------

def raw_controls(text: str) -> list[str]:
    """The characters of `text` a terminal would act on (a newline ends a line and is allowed)."""
    return [c for c in text if c != "\n" and (unicodedata.category(c) in terminal.UNPRINTABLE and c not in terminal.JOINERS)]


LOADERS = ("build_toy", "from_pretrained", "load_gguf", "load_folder", "load_native", "load_into", "_build_model")


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every way anatomy loads weights, builds a toy or builds a run's model is recorded (in the
    list returned) and stopped there."""
    import importlib
    import sys

    from anatomy.checkpoints import files, gguf

    import pkgutil

    import anatomy.checkpoints

    # The floors import the loaders when they run (anatomy.lazy): import every module that defines one
    # first, so that each is replaced where it is defined and wherever it was bound.
    for target in cli.SUBCOMMANDS.values():
        importlib.import_module(target[0].partition(":")[0])
    for module in pkgutil.iter_modules(anatomy.checkpoints.__path__, "anatomy.checkpoints."):
        if module.name != "anatomy.checkpoints.fit_toys":
            importlib.import_module(module.name)
    importlib.import_module("anatomy.training.build")

    loads: list[str] = []

    def refusing(what: str):
        def refuse(*args, **kwargs):
            loads.append(what)
            raise RuntimeError(f"{what}: weights were loaded (or a model built) before the arguments were refused")
        return refuse

    for name, module in list(sys.modules.items()):
        if name == "anatomy" or name.startswith("anatomy."):
            for loader in LOADERS:
                if callable(getattr(module, loader, None)):
                    monkeypatch.setattr(module, loader, refusing(f"{name}.{loader}"))
    for reader in (files._SafetensorsShard, files._PickleShard, gguf.GgufWeights):
        monkeypatch.setattr(reader, "get", refusing(f"{reader.__name__}.get"))
    return loads


# (argv, a word the one-line refusal must contain). {tmp} is a fresh folder, {data} a text file in it,
# {tsv} a small labelled file. Each is refused before any weight loads or any model is built.
ESCAPES = "\x1b]0;PWNED\x07\u202e"
BEFORE_LOADING = [
    (["walk", "--model", "smolm2"], "did you mean 'smollm2'"),
    (["walk", "--model", "SmolLM2"], "did you mean 'smollm2'"),
    (["walk", "--model", "smollm2", "--layer", "30"], "layer 30 is out of range"),
    (["walk", "--model", "minilm", "--head", "12"], "head 12 is out of range"),
    (["walk", "--layer", "2"], "layer 2 is out of range"),
    (["walk", "--out", ""], "an empty file name"),
    (["walk", "--out", "{tmp}/no/such/walk.html"], "does not exist"),
    (["walk", "--out", "/proc/walk.html"], "no file can be created in /proc"),
    (["walk", "--out", "{tmp}"], "is a folder"),
    (["walk", "--out", "{tmp}/" + ESCAPES + "/walk.txt"], "does not exist"),
    (["walk", "--model", "toy-encoder", "--target", "x"], "--target"),
    (["walk", "--model", "minilm", "--norm-position", "pre"], "--norm-position"),
    (["walk", b"\xff\xfe".decode("utf-8", "surrogateescape")], "UTF-8"),
    (["walk", "Hello " * 17_000], "at most 1024"),
    (["walk", "--device", "cpu:5"], "cpu:5"),
    (["walk", "--seed", str(2**63)], "--seed"),
    (["walk", "--example", "armas", "some text"], "--example"),
    (["walk", "--model", "x" * 100_000], "File name too long"),
    (["walk", "--format", "x" * 100_000], "more characters"),  # argparse repeats the value: the line is cut
    (["walk", "--model", "no/such" + ESCAPES], "no/such"),
    (["analyze", "lens", "--model", "smollm2"], "needs TEXT"),
    (["analyze", "lens", "Hello", "--model", "minilm"], "token logits"),
    (["analyze", "dla", "Hello"], "pre-norm"),
    (["analyze", "decompose", "Hello", "--model", "minilm"], "pre-norm"),
    (["analyze", "heads", "Hello"], "takes no TEXT"),
    (["analyze", "patch", "--clean", "Hello"], "--corrupt"),
    (["analyze", "lens", "Hello", "--kind", "induction"], "--kind is for heads"),
    (["analyze", "lens", "Hello", "--steps", "8"], "--steps is for ig"),
    (["analyze", "ig", "Hello", "--steps", "100000"], "--steps"),
    (["analyze", "lens", "Hello", "--out", "{tmp}/lens.pdf"], ".html, .png or .svg"),
    (["analyze", "lens", "Hello", "--out", "{tmp}/no/such/lens.html"], "does not exist"),
    (["analyze", "lens", "Hello", "--out", "{tmp}/" + ESCAPES + "/lens.html"], "does not exist"),
    (["analyze", "rollout", "Hello", "--model", "toy-seq2seq"], "--target-text"),
    (["analyze", "lens", "Hello", "--target-text", "x"], "--target-text"),
    (["analyze", "lens", "Hello", "--model", "smolm2"], "did you mean"),
    (["viz", "Hello", "--view", "model", "--head", "99", "--out", "{tmp}/v.html"], "--head 99 is out of range"),
    (["viz", "Hello", "--head", "1", "--out", "{tmp}/v.html"], "shows every head"),
    (["viz", "Hello", "--query", "2", "--out", "{tmp}/v.html"], "--query"),
    (["viz", "Hello", "--new-tokens", "3", "--out", "{tmp}/v.html"], "--new-tokens"),
    (["viz", "Hello", "--model", "smollm2", "--layer", "30", "--out", "{tmp}/v.html"], "--layer 30"),
    (["viz", "Hello", "--view", "generation", "--model", "toy-encoder", "--out", "{tmp}/v.html"], "decoder"),
    (["viz", "Hello", "--view", "generation", "--new-tokens", "100000", "--out", "{tmp}/v.html"], "16 positions"),
    (["viz", "Hello", "World", "--out", "{tmp}/v.html"], "TEXT_B"),
    (["viz", "Hello", "--out", ""], "an empty file name"),
    (["viz", "Hello", "--png", "{tmp}/v.html"], ".png"),
    (["viz", "Hello"], "nothing to write"),
    (["generate", "--model", "minilm"], "encoder"),
    (["generate", "--model", "smolm2"], "did you mean"),
    (["generate", "--src", "x"], "--src"),
    (["generate", "--model", "toy-seq2seq", "--chat", "Hello"], "--chat"),
    (["generate", "--max-new-tokens", "100000000"], "--max-new-tokens"),
    (["generate", "--strategy", "beam", "--num-beams", "1000"], "--num-beams"),
    (["generate", "--strategy", "beam", "--num-beams", "2", "--length-penalty", "11"], "--length-penalty"),
    (["generate", "--seed", "-1"], "--seed"),
    (["parity", "--model", "toy"], "toy"),
    (["parity", "smolm2"], "did you mean"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--context", "1000000000000"], "needs"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--d-model", "1000000000"], "needs"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--batch-size", "100000000"], "needs"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--n-layers", "100000"], "--n-layers"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--d-model", "100", "--n-heads", "3"], "divisible"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--threads", "4096"], "--threads"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--vocab-size", "10000000"], "--vocab-size"),
    (["train", "lm", "--data", "{data}", "--out", ""], "an empty folder name"),
    (["train", "lm", "--data", "{data}", "--out", "{data}"], "is a file"),
    (["train", "lm", "--data", "{tmp}/no-such.txt", "--out", "{tmp}/run"], "does not exist"),
    (["train", "classify", "--train", "{tsv}", "--out", "{tmp}/run", "--labels", ""], "empty label"),
    (["train", "classify", "--train", "{tsv}", "--out", "{tmp}/run", "--labels", "a,a"], "twice"),
    (["train", "classify", "--train", "{tsv}", "--out", "{tmp}/run", "--init", "smollm2"], "encoder"),
    (["train", "seq2seq", "--src", "{data}", "--tgt", "{data}", "--test-src", "{data}", "--out", "{tmp}/run"],
     "--test-tgt"),
    (["train", "seq2seq", "--src", "{data}", "--tgt", "{data}", "--val-tgt", "{data}", "--out", "{tmp}/run"],
     "--val-src"),
    (["bench", "--threads", "4096"], "--threads"),
    (["bench", "--repeats", "100000"], "--repeats"),
    (["sae", "train", "--point", "blocks.0.resid_post", "--data", "{tmp}/no-such.txt", "--out", "{tmp}/run"],
     "no-such.txt does not exist"),
    (["sae", "train", "--point", "blocks.0.resid_post", "--data", "{tmp}", "--out", "{tmp}/run"], "is not a file"),
    (["sae", "train", "--point", "blocks.0.resid_post", "--data", "{data}", "--out", "{data}"], "is a file; give a folder"),
    (["sae", "features", "{tmp}", "--data", "{data}", "--out", "{tmp}/page.txt"], ".html or .htm"),
    (["sae", "eval", "{tmp}", "--data", "{tmp}/no-such.txt"], "does not exist"),
    (["walk", "--model", "/dev/zero"], "neither a folder nor a file"),
    (["parity", "smollm2", "--text-b", "x"], "is a decoder, which reads one text"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--tokenizer", ""], "an empty name"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--tokenizer", "bpe2"], "no tokenizer kind"),
    (["--threads", "2", "walk"], "options go after it, `anatomy COMMAND --threads"),
]


def _fill(argv: list[str], tmp_path) -> list[str]:
    data, tsv = tmp_path / "data.txt", tmp_path / "labels.tsv"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    tsv.write_text("good film\tpos\nbad film\tneg\n" * 10)
    return [a.replace("{tmp}", str(tmp_path)).replace("{data}", str(data)).replace("{tsv}", str(tsv)) for a in argv]


@pytest.mark.parametrize("argv, named", BEFORE_LOADING, ids=[" ".join(argv)[:50] for argv, _ in BEFORE_LOADING])
def test_refused_before_anything_loads_in_one_escaped_bounded_line(argv, named, tmp_path, capsys, nothing_loads):
    status, out, err = run_anatomy(_fill(argv, tmp_path), capsys)
    assert nothing_loads == [], err
    assert status == 2, f"status {status}: {err}"
    assert err.count("\n") == 1 and "Traceback" not in err and not out, err
    assert named in err, err
    assert not raw_controls(err), err
    assert len(err) < 900, len(err)
    assert not (tmp_path / "run").exists() and not (tmp_path / "v.html").exists()  # nothing was written


@pytest.mark.parametrize("argv", [["walk"], ["walk", "--model", "minilm"], ["generate"],
                                  ["analyze", "lens", "Hello", "--model", "smollm2"], ["viz", "Hello", "--out", "{tmp}/v.html"],
                                  ["train", "lm", "--data", "{data}", "--out", "{tmp}/run", "--max-steps", "1"]])
def test_the_guard_sees_a_load(argv, tmp_path, capsys, nothing_loads):
    """The guard above has teeth: a valid command does reach a loader."""
    run_anatomy(_fill(argv, tmp_path), capsys)
    assert nothing_loads


def test_the_cases_cover_every_subcommand_that_loads_a_model():
    covered = {argv[0] for argv, _ in BEFORE_LOADING}
    assert {"walk", "analyze", "viz", "generate", "parity", "train", "bench"} <= covered


# What a user gives comes back escaped ---------------------------------------------------------------

HOSTILE_NAME = "a\x1b[2J\x07\u202egnp."  # clears the screen, rings, and shows the name backwards


def test_a_hostile_output_path_is_escaped_when_written(tmp_path, capsys):
    for argv in (["walk", "--out", f"{tmp_path}/{HOSTILE_NAME}walk.txt"],
                 ["analyze", "lens", "Hello World,", "--out", f"{tmp_path}/{HOSTILE_NAME}lens.html"],
                 ["viz", "Hello World,", "--out", f"{tmp_path}/{HOSTILE_NAME}view.html"]):
        status, out, err = run_anatomy(argv, capsys)
        assert status == 0, err
        assert not raw_controls(out + err) and "\\x1b[2J" in out + err, out + err
    assert len(list(tmp_path.iterdir())) == 3  # written under the names given


def test_a_training_run_in_a_hostile_folder_and_its_resume_warning_are_escaped(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be, that is the question\n" * 40)
    run_dir = tmp_path / HOSTILE_NAME
    argv = ["train", "lm", "--data", str(data), "--out", str(run_dir), "--cache-dir", str(tmp_path / "cache"),
            "--context", "8", "--batch-size", "2", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
            "--eval-every", "0", "--eval-batches", "1", "--no-progress", "--save-every", "1"]
    status, out, err = run_anatomy(argv + ["--max-steps", "2"], capsys)
    assert status == 0, err
    assert not raw_controls(out + err) and "\\x1b[2J" in out, out
    (run_dir / "checkpoints" / "step-00000002" / "state.json").write_text("{")  # damaged: resume falls back
    # in a process of its own: pytest records warnings instead of showing them
    resumed = subprocess.run([sys.executable, "-c", "import sys; from anatomy.cli import main; sys.exit(main())",
                              *argv, "--max-steps", "3", "--resume"], capture_output=True, text=True,
                             errors="surrogateescape", timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    warning = [line for line in resumed.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith("anatomy train lm: warning: skipped damaged checkpoints"), resumed.stderr
    assert not raw_controls(resumed.stdout + resumed.stderr), resumed.stderr
    assert not (run_dir / ".lock").exists()  # removed on exit


def test_a_panic_in_a_rust_extension_is_one_line_and_status_1(monkeypatch, capsys):
    class PanicException(BaseException):  # what pyo3 raises: not an Exception
        pass

    def panic(args):
        raise PanicException("regex: nested quantifier (a+)+$")

    from anatomy.checkpoints import cli as checkpoints_cli

    monkeypatch.setattr(checkpoints_cli, "run_models", panic)
    status, out, err = run_anatomy(["models"], capsys)
    assert status == 1 and err.count("\n") == 1 and "internal error: PanicException" in err, err


def test_every_option_with_a_default_shows_it_in_help():
    import argparse

    for command in cli.SUBCOMMANDS:
        parser = cli.build_parser(command)
        parsers = [parser]
        while parsers:
            current = parsers.pop()
            formatter = current._get_formatter()
            for action in current._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parsers.extend(action.choices.values())
                elif action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS):
                    assert "default" in formatter._get_help_string(action), (current.prog, action.option_strings)


def test_generate_with_no_arguments_continues_the_toys_sentence_and_says_so(capsys):
    status, out, err = run_anatomy(["generate"], capsys)
    assert status == 0, err
    assert out.strip() == "Hello World, this is Alejandro!"
    assert "no --prompt: continuing the toy's own sentence" in err
    status, out, err = run_anatomy(["generate", "--model", "toy-seq2seq"], capsys)
    assert status == 0 and out.strip() == "Hola Mundo, soy Alejandro!" and "no --src" in err, out + err


# Any arguments: exit 0 or 2, never 1, never a traceback ----------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NUMBERS = st.sampled_from(["0", "1", "-1", "2", "3", "1e3", "nan", "inf", "-0", "0.5", "99999999999", "x", "",
                           str(2**63), "1_0"])
TEXTS = st.one_of(st.sampled_from(["Hello World, this", "", " ", "<MASK>", "<SOS> <EOS>", "Hola Mundo,",
                                   HOSTILE_NAME, b"\xff".decode("utf-8", "surrogateescape")]),
                  st.text(max_size=30))
OPTIONS = {
    "walk": {"--model": st.sampled_from(["toy", "toy-encoder", "toy-seq2seq", "tooy", ""]), "--layer": NUMBERS,
             "--head": NUMBERS, "--target": TEXTS, "--format": st.sampled_from(["terminal", "markdown", "html", "x"]),
             "--norm-position": st.sampled_from(["pre", "post", "mid"]), "--device": st.sampled_from(["cpu", "cpu:1",
             "cuda:7", "auto", "x"]), "--seed": st.sampled_from(["0", "-1", str(2**64)])},
    "generate": {"--model": st.sampled_from(["toy", "toy-encoder", "toy-seq2seq"]), "--prompt": TEXTS,
                 "--src": TEXTS, "--max-new-tokens": NUMBERS, "--temperature": NUMBERS, "--top-k": NUMBERS,
                 "--top-p": NUMBERS, "--num-beams": st.sampled_from(["1", "2", "0", "300"]),
                 "--strategy": st.sampled_from(["greedy", "sample", "beam", "x"]), "--seed": NUMBERS,
                 "--length-penalty": NUMBERS, "--chat": TEXTS},
    "viz": {"--model": st.sampled_from(["toy", "toy-encoder", "toy-seq2seq"]), "--layer": NUMBERS, "--head": NUMBERS,
            "--query": NUMBERS, "--new-tokens": NUMBERS,
            "--view": st.sampled_from(["head", "model", "neuron", "generation", "x"])},
    "analyze": {"--model": st.sampled_from(["toy", "toy-encoder", "toy-seq2seq"]), "--target": TEXTS,
                "--target-text": TEXTS, "--kind": st.sampled_from(["induction", "x"]), "--steps": NUMBERS,
                "--point": st.sampled_from(["resid_pre", "attn.out", "nowhere"]), "--clean": TEXTS,
                "--corrupt": TEXTS, "--by": st.sampled_from(["position", "head", "layer", "x"])},
}
POSITIONAL = {"walk": st.lists(TEXTS, max_size=1), "generate": st.just([]), "viz": st.lists(TEXTS, min_size=0, max_size=2),
              "analyze": st.tuples(st.sampled_from(["lens", "rollout", "heads", "patch", "gxi", "dla", "x"]),
                                   st.lists(TEXTS, max_size=1)).map(lambda pair: [pair[0], *pair[1]])}


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(OPTIONS)))
    argv = [command, *draw(POSITIONAL[command])]
    for option in draw(st.lists(st.sampled_from(sorted(OPTIONS[command])), max_size=4, unique=True)):
        argv += [option, draw(OPTIONS[command][option])]
    return argv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(argv=command_lines())
def test_any_command_line_ends_in_status_0_or_2_in_printable_lines(argv, tmp_path, capsys):
    if argv[0] in ("viz", "analyze"):
        argv += ["--out", str(tmp_path / "out.html")]
    status, out, err = run_anatomy(argv, capsys)
    assert status in (0, 2), f"{argv}: status {status}: {err}"
    assert "Traceback" not in err and not raw_controls(out + err.replace("\n", "")), (argv, err)
    if status == 2:
        assert err.count("\n") == 1, (argv, err)
