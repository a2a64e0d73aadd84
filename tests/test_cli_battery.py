"""Every mistake on the command line ends in one line on stderr and exit status 2, never a traceback.

The battery runs `anatomy` in this process over bad invocations of every subcommand. Each case
names what its one line must mention: the argument, or the file, at fault.
"""

from __future__ import annotations

import pytest

from anatomy import cli

INVALID_UTF8 = b"caf\xff".decode("utf-8", "surrogateescape")  # what sys.argv holds for those bytes
LONG_TEXT = " ".join(["word"] * 30)

# (argv, a word the error line must contain); {tmp} is a fresh folder, {data} a small text file there.
BATTERY = [
    # the dispatcher
    (["no-such-command"], "is not a command (commands: walk"),
    (["--bogus"], "takes no option --bogus before a command"),
    # generate
    (["generate", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["generate", "--max-new-tokens", "1e3"], "--max-new-tokens"),
    (["generate", "--temperature", "nan"], "--temperature"),
    (["generate", "--temperature", "-1"], "--temperature"),
    (["generate", "--top-p", "0"], "--top-p"),
    (["generate", "--top-p", "1.5"], "--top-p"),
    (["generate", "--top-k", "0"], "--top-k"),
    (["generate", "--num-beams", "0"], "--num-beams"),
    (["generate", "--length-penalty", "nan"], "--length-penalty"),
    (["generate", "--seed", "-1"], "--seed"),
    (["generate", "--strategy", "nucleus"], "--strategy"),
    (["generate", "--device", "cuda:99"], "--device"),
    (["generate", "--device", "tpu"], "--device"),
    (["generate", "--model", "{tmp}/no-such-model"], "no-such-model"),
    (["generate", "--model", "toy-encoder"], "encoder"),
    (["generate", "--model", "toy-seq2seq", "--chat", "Hello"], "--chat"),
    (["generate", "--src", "Hello"], "--src"),
    (["generate", "--prompt", INVALID_UTF8], "UTF-8"),
    (["generate", "--temperature", "0.5", "--strategy", "greedy"], "--temperature"),
    (["generate", "--num-beams", "3", "--strategy", "greedy"], "--num-beams"),
    # viz
    (["viz"], "TEXT"),
    (["viz", "Hello"], "--out"),
    (["viz", "Hello", "--layer", "7", "--out", "{tmp}/v.html"], "layer"),
    (["viz", "Hello", "--head", "-1", "--out", "{tmp}/v.html"], "--head"),
    (["viz", "Hello", "--view", "sideways"], "--view"),
    (["viz", "Hello", "--view", "generation", "--new-tokens", "100000", "--out", "{tmp}/v.html"], "new tokens"),
    (["viz", "Hello", "World", "--out", "{tmp}/v.html"], "TEXT_B"),
    (["viz", "Hello", "--model", "toy-seq2seq", "--view", "generation", "--out", "{tmp}/v.html"], "decoder"),
    (["viz", INVALID_UTF8, "--out", "{tmp}/v.html"], "UTF-8"),
    (["viz", "Hello", "--png", "{tmp}/v.gif"], ".gif"),
    (["viz", "Hello", "--out", "{tmp}/no/such/folder/v.html"], "v.html"),
    (["viz", "Hello", "--device", "cuda:99", "--out", "{tmp}/v.html"], "--device"),
    # parity and models
    (["parity", "--model", "{tmp}/no-such-checkpoint"], "no-such-checkpoint"),
    (["parity", "--tol", "-1"], "--tol"),
    (["parity", "--seed", "-3"], "--seed"),
    (["models", "--bogus"], "unknown option --bogus"),
    # analyze
    (["analyze", "nosuch"], "invalid choice"),
    (["analyze", "lens", "Hello", "--model", "{tmp}/no-such-model"], "no-such-model"),
    (["analyze", "ig", "Hello", "--steps", "0"], "--steps"),
    # bench
    (["bench", "--only", "nothing"], "--only"),
    (["bench", "--repeats", "-1"], "--repeats"),
    (["bench", "--threads", "x"], "--threads"),
    # walk
    (["walk", "--model", "gpt-17"], "gpt-17"),
    (["walk", "--layer", "5"], "layer"),
    (["walk", "--head", "2"], "head"),
    (["walk", "--device", "cuda:99"], "--device"),
    # sae
    (["sae", "nosuch"], "invalid choice"),
    # explore
    (["explore", "--port", "99999"], "--port"),
    # circuits
    (["circuits"], "the following arguments are required: --transcoders, --out"),
    (["circuits", "--transcoders", "t", "--out", "{tmp}/g.html"], "one of the arguments TEXT --prompt is required"),
    (["circuits", "discover", "--task", "nosuch"], "--task"),
    (["circuits", "discover", "--steps", "0"], "--steps"),
    # train
    (["train"], "TASK"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--log-every", "0"], "--log-every"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--grad-accum", "0"], "--grad-accum"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--eval-batches", "0"], "--eval-batches"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--label-smoothing", "2"], "--label-smoothing"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--max-steps", "0"], "--max-steps"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--max-steps", "-5"], "--max-steps"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--eval-every", "-1"], "--eval-every"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--save-every", "-3"], "--save-every"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--warmup", "-10"], "--warmup"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--clip", "-1"], "--clip"),
    (["train", "lm", "--data", "{data}", "--out", "{tmp}/r", "--device", "cuda:99"], "--device"),
    (["train", "lm", "--data", "{tmp}/no-such-file.txt", "--out", "{tmp}/r"], "no-such-file.txt"),
]


def run_anatomy(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of `anatomy argv` in this process; an exception escaping is a traceback."""
    try:
        status = cli.main(argv)
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv, named", BATTERY, ids=[" ".join(argv)[:60] for argv, _ in BATTERY])
def test_a_mistake_is_one_line_and_status_2(argv, named, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{data}", str(data)) for a in argv]
    status, err = run_anatomy(argv, capsys)
    lines = err.strip().splitlines()
    assert status == 2, f"status {status}: {err}"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert named in lines[0], lines[0]
    assert not (tmp_path / "v.html").exists()  # a refused command writes nothing


def test_the_battery_covers_every_subcommand():
    covered = {argv[0] for argv, _ in BATTERY}
    assert set(cli.SUBCOMMANDS) <= covered, set(cli.SUBCOMMANDS) - covered
    assert len(BATTERY) >= 40
