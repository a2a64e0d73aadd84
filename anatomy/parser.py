"""How the command line tells a mistake: argparse, with every error one bounded, escaped line that names
the full command, the unknown option or the misspelt choice, and what was meant.

    $ anatomy circuits discover --task iio
    anatomy circuits discover: error: argument --task: 'iio' is not a task; did you mean 'ioi'? ...
    $ anatomy circuits "The capital of Germany is" --transcoders runs/tc --ouput g.html
    anatomy circuits: error: unknown option --ouput; did you mean --out? (see anatomy circuits --help)

Options are never abbreviated (allow_abbrev=False): `--transcoder` is refused with "did you mean
--transcoders?", not taken for it, so that a new option never changes what an old command line means.
"""

from __future__ import annotations

import argparse
import difflib

from .terminal import one_line

MAX_MESSAGE = 500  # characters of a message the command line prints, whatever the input


def closest(word: str, allowed, cutoff: float = 0.6) -> str | None:
    """The one of `allowed` closest to `word` (difflib's ratio at least `cutoff`, case ignored), or None:
    what a "did you mean" names."""
    close = difflib.get_close_matches(word.lower(), [str(a) for a in allowed], n=1, cutoff=cutoff)
    return close[0] if close else None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with every option's default shown, "(default: ...)", where its help does not
    already say it (flags and options without a default show none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        flag = action.nargs == 0  # --quiet, --no-bias: the help says what giving it does
        if "default" in help or flag or action.default is None or action.default is argparse.SUPPRESS \
                or not action.option_strings:
            return help
        return help + (" " if help else "") + "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, for the command and every subcommand (add_parser makes them of this class too):

    - a mistake is one line, "prog: error: ...; see prog --help", prog the full subcommand
      (`anatomy sae train-transcoders`), its message bounded to MAX_MESSAGE and escaped;
    - an option it does not know is named first, with the closest it knows, whatever else is wrong
      (a misspelt --out also leaves --out missing);
    - a choice not among the allowed gets "did you mean";
    - no abbreviations; the defaults shown in --help (HelpFormatter);
    - the parsed namespace's `_prog` names the subcommand that parsed it (its errors say it too).
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.set_defaults(_prog=self.prog)
        self._given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, but what is left over is refused here, by the subcommand that did not know it."""
        self._given = list(args) if args is not None else []
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras

    def error(self, message: str):
        unknown = self.unknown_option(self._given)
        if unknown:
            known = [s[2:] for s in self._option_string_actions if s.startswith("--")]
            meant = closest(unknown.lstrip("-"), known)  # compared without the dashes every option shares
            meant = meant and f"--{meant}"
            message = f"unknown option {unknown}" + (f"; did you mean {meant}?" if meant else "")
        self.exit(2, f"{self.prog}: error: {one_line(message, MAX_MESSAGE)} (see {self.prog} --help)\n")

    def unknown_option(self, args: list[str]) -> str | None:
        """The first of `args` that reads as an option (-x, --name, --name=value) and that this parser
        does not take, before `--` and before a subcommand's name (what follows is the subcommand's);
        None when there is none."""
        commands = {name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                    for name in action.choices}
        for arg in args:
            if arg == "--" or arg in commands:
                return None
            if arg[:1] != "-" or len(arg) == 1 or " " in arg or self._negative_number_matcher.match(arg):
                continue  # a value (argparse reads a word with a space, or a negative number, as one too)
            flag = arg.split("=", 1)[0]
            if flag not in self._option_string_actions:
                return one_line(flag, 100)
        return None

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is not None and value not in action.choices:
            allowed = list(action.choices)
            meant = closest(str(value), allowed)
            raise argparse.ArgumentError(action, f"invalid choice: {one_line(repr(value), 100)}"
                                                 + (f"; did you mean {meant!r}?" if meant else "")
                                                 + f" (choose from {', '.join(map(repr, allowed))})")


def leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(the words after the command that reach it, the parser) for every parser under `parser` that takes
    no subcommand of its own: each (sub)command a user can run."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from leaf_parsers(sub, (*path, name))


__all__ = ["HelpFormatter", "MAX_MESSAGE", "Parser", "closest", "leaf_parsers"]
