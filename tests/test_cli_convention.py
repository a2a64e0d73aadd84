"""One command line: every command and subcommand, walked from the parser itself (anatomy.cli.every_command),
so that a new one is held to the same rules without a line here.

- a mistake is refused before torch is imported, in one escaped, bounded line naming the full subcommand
  (test_refusals.py runs MISTAKES, made here);
- an unknown option is named, with "did you mean"; options are never abbreviated;
- a choice not allowed gets "did you mean";
- every command that computes takes --device, --threads and --no-progress, with one default and one help;
- --model's default follows one rule, stated in its help.
"""

from __future__ import annotations

import argparse

import pytest

from anatomy.arguments import DEVICE_HELP, NO_PROGRESS_HELP
from anatomy.cli import every_command, main

COMMANDS = {parser.prog: (words, parser) for words, parser in every_command()}

# What a command leaves out of the convention, and why (a new command is in it unless it says here why not).
NOT_COMPUTING = {"anatomy models": "lists names, computes nothing"}
NO_DEVICE = {"anatomy parity": "transformers, the reference, runs on the CPU",
             "anatomy bench": "measures the CPU against its own ceilings",
             "anatomy explore": "the explorer's models run on the CPU"}
NO_PROGRESS = {"anatomy explore": "a server: each job shows its progress on the page"}
# --model meaning something else than the one model a command runs
OTHER_MODEL = {"anatomy explore": "the models the page may show", "anatomy train classify": "--init, an encoder to fine-tune"}
# a command whose --model default is not toy, and arguments with which toy is refused before anything loads
NOT_TOY = {"anatomy parity": [], "anatomy circuits discover": ["--task", "ioi"]}
CANDIDATES = ["", "x", "-1", "0", "2", "nan", "/no/such/folder/f.html", "tpu"]  # bad for most typed values


def bad_value(action: argparse.Action) -> str | None:
    """A value `action`'s type refuses (the first of CANDIDATES), or None when it takes them all."""
    if action.type is None:
        return None
    for candidate in CANDIDATES:
        try:
            action.type(candidate)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            return candidate
    return None


def mistakes() -> list[tuple[str, list[str], str]]:
    """(prog, argv, what the one line must say) for every command: an unknown option, a prefix of an option,
    every choice misspelt (its first allowed value and an x: "did you mean" it), and every typed value given a
    value it refuses."""
    cases = []
    for prog, (words, parser) in COMMANDS.items():
        words = list(words)
        cases.append((prog, words + ["--no-such-option"], "unknown option --no-such-option"))
        first = next((a for a in parser._actions if not a.option_strings and a.dest != "help"), None)
        if first is not None and first.choices:  # a positional choice: `anatomy analyze lensx`
            allowed = list(first.choices)[0]
            cases.append((prog, words + [f"{allowed}x"], f"did you mean {allowed!r}?"))
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            flag = action.option_strings[-1]
            if action.choices is not None:
                allowed = list(action.choices)[0]
                cases.append((prog, words + [flag, f"{allowed}x"], f"invalid choice: '{allowed}x'; did you mean {allowed!r}?"))
            elif (value := bad_value(action)) is not None:
                cases.append((prog, words + [flag, value], f"argument {flag}"))
            if flag.startswith("--") and len(flag) > 5:  # a prefix is no abbreviation
                cases.append((prog, words + [flag[:-1], "x"], f"unknown option {flag[:-1]}"))
    return cases


MISTAKES = mistakes()


def test_the_walk_reaches_every_subcommand():
    assert {"anatomy sae train-transcoders", "anatomy circuits discover", "anatomy train classify",
            "anatomy explore", "anatomy bench"} <= set(COMMANDS)
    assert len(MISTAKES) > 5 * len(COMMANDS)


@pytest.mark.parametrize("argv, said", [
    (["circuits", "Hi", "--transcoders", "t", "--ouput", "g.html"], "unknown option --ouput; did you mean --out?"),
    (["circuits", "Hi", "--transcoder", "t", "--out", "g.html"], "unknown option --transcoder; did you mean --transcoders?"),
    (["circuits", "discover", "--task", "iio"], "'iio' is not a task; did you mean 'ioi'?"),
    (["circuits", "discover", "--task", "ioi", "--method", "eap_ig"], "did you mean 'eap-ig'?"),
    (["sae", "trian"], "invalid choice: 'trian'; did you mean 'train'?"),
    (["sae", "train-transcoders", "--kind", "batchtop"], "did you mean 'batchtopk'?"),
    (["analyze", "lense", "Hi"], "did you mean 'lens'?"),
    (["walk", "--format", "markdwn"], "did you mean 'markdown'?"),
    (["train", "lm", "--schedule", "cosin"], "did you mean 'cosine'?"),
    (["train", "lm", "--tokenizer", "bep"], "did you mean 'bpe'?"),
])
def test_a_misspelling_is_named_with_what_was_meant(argv, said, capsys):
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2 and said in err and err.count("\n") == 1, err


def test_unknown_options_come_before_what_they_left_missing(capsys):
    """A misspelt --out also leaves --out missing: the misspelling is what the user needs to hear."""
    with pytest.raises(SystemExit):
        main(["sae", "train-transcoders", "--data", "README.md", "--ouput", "runs/x"])
    err = capsys.readouterr().err
    assert err.startswith("anatomy sae train-transcoders: error: unknown option --ouput; did you mean --out?"), err
    assert "required" not in err


@pytest.mark.parametrize("prog", sorted(set(COMMANDS) - set(NOT_COMPUTING)))
def test_every_computing_command_takes_device_threads_and_no_progress_alike(prog):
    options = {flag: action for action in COMMANDS[prog][1]._actions for flag in action.option_strings}
    assert options["--threads"].default is None and options["--threads"].help.startswith("torch CPU threads (default: ")
    if prog not in NO_PROGRESS:
        assert options["--no-progress"].help == NO_PROGRESS_HELP and options["--no-progress"].default is False
    if prog not in NO_DEVICE:
        assert options["--device"].help == DEVICE_HELP and options["--device"].default == "cpu"


def test_the_threads_help_is_one_text():
    helps = {action.help for _, parser in COMMANDS.values() for action in parser._actions
             if "--threads" in action.option_strings}
    assert len(helps) == 1, helps


@pytest.mark.parametrize("prog", sorted(p for p in COMMANDS if p not in OTHER_MODEL and any(
    "--model" in a.option_strings for a in COMMANDS[p][1]._actions)))
def test_the_model_default_follows_one_rule(prog, capsys):
    """The model the SAE or transcoders name; else the smallest built-in model that runs the command: toy,
    unless toy is refused by it."""
    action = next(a for a in COMMANDS[prog][1]._actions if "--model" in a.option_strings)
    if action.default is None:
        assert "(default: the model named in the" in action.help
        return
    assert f"(default: {action.default}, the smallest built-in model that runs this command)" in action.help
    if action.default != "toy":
        words = list(COMMANDS[prog][0])
        try:
            status = main(words + NOT_TOY[prog] + ["--model", "toy"])
        except SystemExit as exit:
            status = exit.code
        assert status == 2 and "toy" in capsys.readouterr().err
