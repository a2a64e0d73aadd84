"""The `anatomy` command: one dispatcher, nothing else.

Each subcommand lives in its floor's cli.py and provides two functions: `add_arguments(parser)` and
`run(args) -> int` (or, for a floor with several commands, "module:name" and `add_name_arguments`,
`run_name`). They are imported only when used, so `anatomy walk` never pays for importing the
trainer or the browser views.

A mistake on the command line, or an input the model refuses, ends in one line on stderr and exit
status 2, never a traceback (ANATOMY_DEBUG=1 shows the traceback):

    $ anatomy generate --model toy --temperature -1
    anatomy generate: error: argument --temperature: -1 is not a positive number

The argument values every floor shares are in arguments.py, how a mistake is told in parser.py, the
one progress display in progress.py, text made safe for a terminal in terminal.py.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
import traceback
import warnings

# Nothing here imports torch: every argument is parsed and checked first, and a mistake refused in
# milliseconds; torch (a second or more) loads with the command that runs.
from . import __version__
from .arguments import default_threads, set_threads
from .parser import MAX_MESSAGE, Parser, closest, leaf_parsers
from .terminal import one_line

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "walk": ("anatomy.walk.cli", "narrate one forward pass, step by step, with the real numbers"),
    "viz": ("anatomy.viz.cli", "write a self-contained attention view (HTML) or a static image"),
    "parity": ("anatomy.checkpoints.cli:parity", "compare every intermediate with Hugging Face transformers"),
    "models": ("anatomy.checkpoints.cli:models", "list the built-in models and the architectures anatomy reads"),
    "train": ("anatomy.training.cli", "train a language model, a translator or a classifier"),
    "generate": ("anatomy.generation.cli", "generate text from a trained or pretrained model"),
    "analyze": ("anatomy.analysis.cli", "logit lens, patching, attribution, head detection: each checks its own identity"),
    "bench": ("anatomy.bench.cli", "benchmark anatomy against Hugging Face transformers"),
    "sae": ("anatomy.sae.cli", "sparse autoencoders and transcoders: train, evaluate, show their features"),
    "explore": ("anatomy.explore.cli", "a live page in the browser: type, and watch every step of a model update"),
    "circuits": ("anatomy.circuits.cli", "attribution graphs over transcoder features, and circuits found over data"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (None: list commands only)."""
    parser = Parser(
        prog="anatomy",
        description="The Transformer, taken apart: run, trace, narrate and view every step.",
    )
    parser.add_argument("--version", action="version", version=f"anatomy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name != command:
            continue
        module_name, _, function = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if (error.name or "").startswith("anatomy"):
                raise
            # An optional extra is missing: say which, instead of a traceback.
            sub_parser.set_defaults(_missing=str(error))
            continue
        if function:
            getattr(module, f"add_{function}_arguments")(sub_parser)
            sub_parser.set_defaults(_run=getattr(module, f"run_{function}"))
        else:
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(_run=module.run)
    return parser


# What `anatomy` alone prints: the first commands to try (80 columns), then where the rest is.
FIRST_STEPS = """\
anatomy {version}: the Transformer, taken apart so you can see what it computes.

First commands to try:
  anatomy walk                    narrate one forward pass, step by step
  anatomy explore                 a live page: type, and watch every step update
  anatomy models                  the built-in models and the architectures read
  anatomy analyze lens "The capital of France is" --model smollm2
  anatomy generate --model smollm2 --chat "What is the capital of France?"

{commands}
`anatomy COMMAND --help` says what each takes; `anatomy --help` lists them.
"""


def unknown_command(word: str) -> str | None:
    """The refusal of a first argument that is no command ("did you mean 'walk'?"), or of an option
    given before the command (`anatomy --threads 2 walk`), or None."""
    if word.startswith("-"):
        if word in ("-h", "--help", "--version"):
            return None
        return (f"anatomy takes no option {one_line(word, 100)} before a command: options go after it, "
                f"`anatomy COMMAND {one_line(word, 100)} ...` (commands: {', '.join(SUBCOMMANDS)})")
    if word in SUBCOMMANDS:
        return None
    meant = closest(word, SUBCOMMANDS)
    return (f"{one_line(repr(word), 100)} is not a command" + (f": did you mean {meant!r}?" if meant else "")
            + f" (commands: {', '.join(SUBCOMMANDS)})")


def handed_on(command: str, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]] | None:
    """(the parser, the arguments it parses) when `command`'s floor hands the word after it to another
    module before anything is parsed (its cli's HANDED_ON = {word: module}: `anatomy circuits discover`),
    else None. A module that is not there is said in one line."""
    target = SUBCOMMANDS[command][0]
    if len(argv) < 2 or ":" in target:
        return None
    module_name = getattr(importlib.import_module(target), "HANDED_ON", {}).get(argv[1])
    if module_name is None:
        return None
    return handed_parser(f"anatomy {command} {argv[1]}", module_name), argv[2:]


def handed_parser(prog: str, module_name: str) -> argparse.ArgumentParser:
    """The parser of a command handed on to `module_name` (see handed_on)."""
    parser = Parser(prog=prog)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise
        parser.exit(2, f"{prog}: unavailable: {module_name} is not part of this installation of anatomy\n")
    module.add_arguments(parser)
    parser.set_defaults(_run=module.run)
    return parser


def every_command():
    """(argv words, parser) for every command and subcommand a user can run, handed-on ones included
    (importing every floor's cli.py): what the tests walk, so that a new subcommand is covered."""
    for command, (target, _) in SUBCOMMANDS.items():
        tree = build_parser(command)
        subcommands = next(a for a in tree._actions if isinstance(a, argparse._SubParsersAction))
        yield from leaf_parsers(subcommands.choices[command], (command,))
        if ":" not in target:
            for word, module_name in getattr(importlib.import_module(target), "HANDED_ON", {}).items():
                yield (command, word), handed_parser(f"anatomy {command} {word}", module_name)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        commands = textwrap.fill("Commands: " + ", ".join(SUBCOMMANDS) + ".", 80, subsequent_indent="  ")
        print(FIRST_STEPS.format(version=__version__, commands=commands), end="")
        return 0
    if unknown_command(argv[0]):
        print(f"anatomy: error: {unknown_command(argv[0])}", file=sys.stderr)
        return 2
    command = argv[0] if argv[0] in SUBCOMMANDS else None
    prog = f"anatomy {command}" if command else "anatomy"
    try:
        handed = handed_on(command, argv) if command else None
        if handed:
            prog = handed[0].prog
        parser, rest = handed or (build_parser(command), argv)
        args = parser.parse_args(rest)  # a mistake is said by the (sub)command that met it (parser.Parser)
        prog = args._prog  # the full subcommand, `anatomy sae train-transcoders`, names what it refuses
        if getattr(args, "_missing", None):
            parser.exit(2, f"{prog}: unavailable, a dependency is missing ({args._missing})\n")
        if not hasattr(args, "_run"):
            parser.error("name a command")
        if hasattr(args, "threads"):  # every command that computes
            set_threads(args.threads or default_threads())
        shown, warnings.formatwarning = warnings.formatwarning, _warning_line(prog)
        try:
            return int(args._run(args) or 0)
        finally:
            warnings.formatwarning = shown
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`anatomy walk | head`): nothing more to say, and nowhere to say it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError, MemoryError) as error:
        # anatomy's errors (ConfigError, InputError, CheckpointError, CacheFullError) are ValueErrors
        # whose message names the argument and the allowed values; OSError: a file or a folder.
        if os.environ.get("ANATOMY_DEBUG"):
            raise
        print(f"{prog}: error: {one_line(_describe(error), MAX_MESSAGE)}", file=sys.stderr)
        return 2
    except BaseException as error:  # a bug in anatomy, not the user's mistake: still one line, status 1
        # BaseException: a panic in a Rust extension (tokenizers' PanicException) is not an Exception.
        if isinstance(error, (SystemExit, GeneratorExit)) or os.environ.get("ANATOMY_DEBUG"):
            raise
        where = traceback.extract_tb(error.__traceback__)[-1]
        print(f"{prog}: internal error: {type(error).__name__}: {one_line(str(error), MAX_MESSAGE)} "
              f"(at {os.path.basename(where.filename)}:{where.lineno}; ANATOMY_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def _warning_line(prog: str):
    """warnings.formatwarning for the command line: "prog: warning: ..." as one printable, bounded
    line (a resumed run's skipped checkpoints name paths, which may hold any byte). Only how a
    warning is shown changes: filters, and pytest.warns or a caller's catch_warnings, still work."""

    def format(message, category, filename, lineno, line=None) -> str:
        return f"{prog}: warning: {one_line(str(message), MAX_MESSAGE)}\n"

    return format


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.strerror or error}: {error.filename}"
    if isinstance(error, MemoryError):
        return "out of memory"
    return str(error) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
