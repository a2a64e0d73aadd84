"""The `anatomy` command: one dispatcher, and the argument helpers every subcommand shares.

Each subcommand lives in its floor's cli.py and provides two functions: `add_arguments(parser)` and
`run(args) -> int` (or, for a floor with several commands, "module:name" and `add_name_arguments`,
`run_name`). They are imported only when used, so `anatomy walk` never pays for importing the
trainer or the browser views.

A mistake on the command line, or an input the model refuses, ends in one line on stderr and exit
status 2, never a traceback (ANATOMY_DEBUG=1 shows the traceback):

    $ anatomy generate --model toy --temperature -1
    anatomy generate: error: argument --temperature: -1 is not a positive number
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
import os
import sys
import tempfile
import textwrap
import traceback
import warnings
from pathlib import Path

# Nothing here imports torch: every argument is parsed and checked first, and a mistake refused in
# milliseconds; torch (a second or more) loads with the command that runs.
from . import __version__
from .checkpoints.names import BUILTIN_MODELS, misspelt
from .terminal import JOINERS, UNPRINTABLE, one_line, printable, summary_block  # noqa: F401 (commands import them from here)
from .text import check_text

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

# Typed, ranged argument values -------------------------------------------------------------------
# Each is an argparse `type=`: a bad value becomes "argument --x: <why>" and exit status 2.


def _number(text: str, kind=float):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer (1 or more)")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (0 or more)")
    return value


def seed(text: str) -> int:
    """A random seed: an integer from 0 to 2**63 - 1 (what torch.Generator takes, and the range
    `anatomy generate` draws an unseeded run's seed from, so that every printed seed can be given)."""
    value = _number(text, int)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is not a seed (0 to 2**63 - 1)")
    return value


def finite_float(text: str) -> float:
    return _number(text)


def positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative (0 or more)")
    return value


def probability(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability (0 to 1)")
    return value


def text(value: str) -> str:
    """An argparse type: a text to run a model on, as anatomy.text.check_text takes it (not empty nor
    only white space; valid UTF-8: a shell passes any bytes, and Python keeps the invalid ones as
    lone surrogates, which would fail later, halfway through writing a file)."""
    try:
        return check_text(value, "the text")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _writable_folder(folder: Path, shown: str) -> None:
    """Raise ArgumentTypeError unless a file can be created in `folder` (tried: as root, access()
    says yes to folders such as /proc where nothing can be created)."""
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{shown}: the folder {one_line(str(folder), 200)} does not exist"
                                         if not folder.exists() else f"{shown}: {one_line(str(folder), 200)} is not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{shown}: no file can be created in {one_line(str(folder), 200)} "
                                         f"({error.strerror or error})") from None


def output_file(*suffixes: str):
    """An argparse type for a file to write (--out, --png), checked before any model loads: a name
    (not empty, not a folder), one of `suffixes` if given, in a folder that exists and takes a new file."""

    def check(value: str) -> str:
        shown = one_line(value, 200)
        if not value.strip():
            raise argparse.ArgumentTypeError("an empty file name")
        try:  # a name of bytes that are not UTF-8 would fail only when written into a page or a listing
            check_text(value, "the file name")
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{shown}: {error}") from None
        path = Path(value).expanduser()
        try:
            if value.endswith(os.sep) or path.is_dir():
                raise argparse.ArgumentTypeError(f"{shown} is a folder; give a file name")
            if suffixes and path.suffix.lower() not in suffixes:
                allowed = ", ".join(suffixes[:-1]) + " or " + suffixes[-1] if len(suffixes) > 1 else suffixes[0]
                raise argparse.ArgumentTypeError(f"{shown}: the name must end in {allowed}")
            _writable_folder(path.parent, shown)
        except OSError as error:  # a name or a path too long, a loop of links
            raise argparse.ArgumentTypeError(f"{shown}: {error.strerror or error}") from None
        return value

    return check


def input_file(value: str) -> str:
    """An argparse type for a file to read (--data, --src, --train ...), checked before anything
    runs: it exists, is a file, and opens for reading."""
    shown = one_line(value, 200)
    try:
        if not Path(value).expanduser().is_file():
            raise argparse.ArgumentTypeError(f"{shown} is not a file" if Path(value).expanduser().exists()
                                             else f"{shown} does not exist")
        open(Path(value).expanduser(), "rb").close()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{shown}: {error.strerror or error}") from None
    return value


def threads(text: str) -> int:
    """An argparse type: torch CPU threads, 1 to the cores this process may use."""
    value = positive_int(text)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"{value} threads: this machine gives this process {cores} core(s)")
    return value


def default_threads() -> int:
    """The torch threads a command computes with unless told: OMP_NUM_THREADS when it is set, else
    half the cores this process may use (at least 1). torch's own default, every core, is 10-50x
    slower the moment another program holds one (measured on this project's 2-core machine, one
    core busy: `analyze ig` on SmolLM2 24 s with 1 thread, 586 s with 2)."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) >= 1:
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


def set_threads(count: int) -> None:
    """torch's CPU threads for this command: set now if torch is loaded, else through OMP_NUM_THREADS,
    which torch (its OpenMP runtime) reads when it loads, so that a command's own checks of its
    arguments still come before the second that loading torch takes. Subprocesses inherit it."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    else:
        os.environ["OMP_NUM_THREADS"] = str(count)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads N: torch CPU threads for this command (the dispatcher sets them before it runs)."""
    parser.add_argument("--threads", type=threads, default=None,
                        help=f"torch CPU threads (default: {default_threads()}, half the cores, or OMP_NUM_THREADS)")


def output_folder(value: str) -> str:
    """An argparse type for a folder to write into (a run folder), created if missing: not empty,
    not a file, and its nearest existing ancestor takes new files."""
    shown = one_line(value, 200)
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty folder name")
    path = Path(value).expanduser()
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{shown} is a file; give a folder")
        existing = next(p for p in (path, *path.parents) if p.exists())  # "." or "/" at the latest
        _writable_folder(existing, shown)
    except OSError as error:  # a path too long, a loop of links
        raise argparse.ArgumentTypeError(f"{shown}: {error.strerror or error}") from None
    return value


# --model and --device -----------------------------------------------------------------------------


def add_model_argument(parser: argparse.ArgumentParser, default: str | None = "toy", help: str = "", *,
                       flag: str = "--model", required: bool | None = None, several: bool = False) -> None:
    """`flag` NAME_OR_PATH (--model; `anatomy train` says --init), resolved by anatomy.from_pretrained /
    anatomy.load_tokenizer. required: None means required exactly when there is no default.
    several: the flag may be given more than once (a list)."""
    names = ", ".join(BUILTIN_MODELS)
    where = f" (default: {default})" if default else ""
    parser.add_argument(
        flag, default=default, required=default is None if required is None else required, metavar="NAME_OR_PATH",
        action="append" if several else "store", type=model_name,
        help=(help + "; " if help else "") + f"a built-in model ({names}), a checkpoint folder, a .gguf file "
        f"or a Hugging Face Hub id org/name{where}; `anatomy models` lists them",
    )


def model_name(value: str) -> str:
    """An argparse type for --model: not empty, and not a built-in name misspelt ("did you mean
    'smollm2'?", checkpoints.names.misspelt) unless a file or folder has that name; everything else
    about it is the resolver's to check, when the command runs."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty name; give a built-in model, a folder, a .gguf file or a Hub id")
    try:
        exists = Path(value).expanduser().exists()
    except (OSError, ValueError):  # a name no file system holds: the resolver says so
        return value
    problem = None if exists else misspelt(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def device(text: str) -> str:
    """An argparse type: a torch device that exists on this machine ('auto': cuda, then mps, then cpu)."""
    if text == "cpu":
        return text  # checked without torch (the default of every command)
    import torch

    if text == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N, mps or auto)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is available on this machine (use cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError(f"{text}: Apple's MPS is not available on this machine (use cpu)")
    elif parsed.type != "cpu":
        raise argparse.ArgumentTypeError(f"{text!r}: anatomy runs on cpu, cuda, cuda:N or mps")
    if parsed.type in ("cpu", "mps") and parsed.index not in (None, 0):
        raise argparse.ArgumentTypeError(f"{text!r}: there is one {parsed.type} device; give {parsed.type}")
    return str(parsed)


def add_device_argument(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    """--device cpu|cuda|cuda:N|mps|auto, checked to exist before anything is computed."""
    parser.add_argument("--device", type=device, default=default, metavar="DEVICE",
                        help=f"cpu, cuda, cuda:N, mps or auto (default: {default})")


# The dispatcher ----------------------------------------------------------------------------------


MAX_MESSAGE = 500  # characters of a message the dispatcher prints, whatever the input


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
    """argparse, with a mistake reported in one line ("prog: error: ...; see prog --help") and the
    defaults shown in --help (HelpFormatter), for the command and every subcommand."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message, MAX_MESSAGE)} (see {self.prog} --help)\n")


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
        if word == "-h" or any(len(word) > 2 and option.startswith(word) for option in ("--help", "--version")):
            return None
        return (f"anatomy takes no option {one_line(word, 100)} before a command: options go after it, "
                f"`anatomy COMMAND {one_line(word, 100)} ...` (commands: {', '.join(SUBCOMMANDS)})")
    if word in SUBCOMMANDS:
        return None
    close = difflib.get_close_matches(word.lower(), SUBCOMMANDS, n=1, cutoff=0.6)
    return (f"{one_line(repr(word), 100)} is not a command" + (f": did you mean {close[0]!r}?" if close else "")
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
    prog = f"anatomy {command} {argv[1]}"
    parser = Parser(prog=prog)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise
        parser.exit(2, f"{prog}: unavailable: {module_name} is not part of this installation of anatomy\n")
    module.add_arguments(parser)
    parser.set_defaults(_run=module.run)
    return parser, argv[2:]


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
        args, unknown = parser.parse_known_args(rest)
        if unknown:  # said by the command that got them, not by `anatomy`
            parser.exit(2, f"{prog}: error: {one_line('unrecognized arguments: ' + ' '.join(unknown), MAX_MESSAGE)} "
                           f"(see {prog} --help)\n")
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
