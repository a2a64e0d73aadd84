"""The `anatomy` command's shared parts: --version, typed arguments, --device, errors in one line,
and the checkpoints floor's commands (parity, models)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

import anatomy
from anatomy import arguments, cli
from anatomy.parser import Parser
from anatomy.checkpoints.cli import summary
from anatomy.checkpoints.parity import ParityRow


def run(argv, capsys):
    """(exit status, stdout, stderr) of `anatomy argv`, in this process."""
    try:
        status = cli.main(argv)
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


def test_version(capsys):
    status, out, _ = run(["--version"], capsys)
    assert status == 0 and out.strip() == f"anatomy {anatomy.__version__}"


@pytest.mark.parametrize("kind, good, bad", [
    (arguments.positive_int, {"1": 1, "64": 64}, ["0", "-3", "2.5", "x", ""]),
    (arguments.non_negative_int, {"0": 0, "7": 7}, ["-1", "1e3", "nan"]),
    (arguments.probability, {"0": 0.0, "1": 1.0, "0.25": 0.25}, ["-0.1", "1.5", "nan", "inf"]),
    (arguments.finite_float, {"-2.5": -2.5, "0": 0.0}, ["nan", "inf", "-inf", "one"]),
    (arguments.positive_float, {"0.7": 0.7}, ["0", "-1", "nan", "inf"]),
    (arguments.non_negative_float, {"0": 0.0, "1e-5": 1e-5}, ["-1e-9", "nan"]),
])
def test_typed_arguments_take_their_range_and_refuse_the_rest(kind, good, bad):
    for text, value in good.items():
        assert kind(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)


def test_text_refuses_invalid_utf8_as_a_shell_passes_it():
    raw = b"caf\xff".decode("utf-8", "surrogateescape")  # what sys.argv holds for those bytes
    with pytest.raises(argparse.ArgumentTypeError, match=r"not valid UTF-8 \(byte ff at character 3,"):
        arguments.text(raw)
    assert arguments.text("café") == "café"


def test_absent_devices_are_named_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    parser = Parser(prog="anatomy x")
    arguments.add_device_argument(parser)
    for device, message in [("cuda", "no CUDA GPU is available"), ("cuda:1", "no CUDA GPU is available"),
                            ("mps", "MPS is not available"), ("tpu", "is not a device"),
                            ("cpu:x", "is not a device")]:
        with pytest.raises(SystemExit) as exit:
            parser.parse_args(["--device", device])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert arguments.device("auto") == "cpu" and arguments.device("cpu") == "cpu"


def test_a_cuda_index_past_the_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert arguments.device("cuda:1") == "cuda:1"
    with pytest.raises(argparse.ArgumentTypeError, match=r"has 2 CUDA GPU\(s\), cuda:0 to cuda:1"):
        arguments.device("cuda:2")


def test_errors_are_one_line_and_control_characters_never_reach_the_terminal(capsys):
    status, _, err = run(["viz", "x", "--model", "no/such\x1b]0;PWNED\x07dir", "--out", "/nonexistent/v.html"],
                         capsys)
    assert status == 2 and "\x1b" not in err and "\x07" not in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_debug_variable_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("ANATOMY_DEBUG", "1")
    with pytest.raises(ValueError):
        cli.main(["parity", "--model", "/no/such/checkpoint"])


def test_models_lists_the_builtin_names_and_every_architecture(capsys):
    from anatomy.checkpoints import ARCHITECTURES

    status, out, _ = run(["models"], capsys)
    assert status == 0
    for name in ("toy", "toy-encoder", "toy-seq2seq", "minilm", "smollm2", *ARCHITECTURES):
        assert f"  {name}" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    for architecture in ARCHITECTURES.values():  # a class name is never split across lines
        assert all(name in out for name in architecture.classes)


# parity ------------------------------------------------------------------------------------------

def test_parity_summary_says_nan_when_a_row_is_nan():
    rows = [ParityRow("a", "x", (1,), 0.0, True), ParityRow("b", "y", (1,), math.nan, False)]
    line = summary(rows, 1e-5)
    assert "worst NaN (1 NaN)" in line and "1 beyond" in line
    assert "worst 3.00e-06" in summary([ParityRow("a", "x", (1,), 3e-6, True)], 1e-5)


def char_tokenizer_checkpoint(transformers, directory, positions: int):
    """A GPT-2 with `positions` positions and a one-character-per-token tokenizer.json."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    chars = sorted(set("The quick brown fox jumps over the lazy dog. Hello world."))
    backend = Tokenizer(WordLevel({c: i for i, c in enumerate(["<unk>", *chars])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=positions, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(directory)
    backend.save(str(directory / "tokenizer.json"))
    return directory


def test_parity_on_a_short_context_cuts_the_pangram_and_says_so(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    path = char_tokenizer_checkpoint(transformers, tmp_path, positions=32)
    status, out, err = run(["parity", "--model", str(path)], capsys)
    assert status == 0, out + err
    assert "the text input has 44 tokens; the model takes 32 positions: compared on the first 32" in out
    assert "all within" in out


def test_parity_shows_no_third_party_progress_bar_and_leaves_them_as_they_were(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from huggingface_hub import utils as hub_utils

    path = char_tokenizer_checkpoint(transformers, tmp_path, positions=64)
    capsys.readouterr()  # transformers' own save shows a bar: not parity's doing
    status, out, err = run(["parity", "--model", str(path)], capsys)
    assert status == 0, out + err
    assert "Loading weights" not in out + err and "it/s" not in out + err
    assert transformers.utils.logging.is_progress_bar_enabled() and not hub_utils.are_progress_bars_disabled()


def test_parity_says_each_stage_as_it_starts_on_stderr(tmp_path, capsys):
    """SmolLM2's parity takes 20-30 s (transformers' GGUF reader, most of it): the wait is never silent."""
    transformers = pytest.importorskip("transformers")
    path = char_tokenizer_checkpoint(transformers, tmp_path, positions=64)
    capsys.readouterr()
    status, out, err = run(["parity", "--model", str(path)], capsys)
    assert status == 0, out + err
    stages = [line.split("] ", 1)[1] for line in err.splitlines()]
    assert [stage.split(" ")[0] for stage in stages] == ["importing", "loading", "loading", "running", "running",
                                                         "comparing"], err
    assert "with transformers (GPT2LMHeadModel)" in stages[2] and "intermediates" in stages[-1]
    assert "importing" not in out and "all within" in out  # the table alone on stdout
    assert all(line.startswith("[") and line.endswith(" …") and len(line) <= 80 for line in err.splitlines())


def test_threads_are_set_before_torch_loads_and_after(tmp_path):
    """--threads reaches torch whether the command loaded it already or loads it after its checks."""
    import subprocess
    import sys

    import os

    script = ("from anatomy.arguments import set_threads; set_threads(1); import torch; a = torch.get_num_threads(); "
              "set_threads(2); print(a, torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=120)
    assert result.stdout.split() == ["1", "2"], result.stderr


def _options_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _options_without_help(sub, f"{path} {name}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize("command", list(cli.SUBCOMMANDS))
def test_every_option_of_every_command_says_what_it_does(command):
    parser = cli.build_parser(command)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert _options_without_help(subcommands.choices[command], f"anatomy {command}") == []
