"""The argument values every command shares: typed, ranged, checked before anything loads.

Each function here is an argparse `type=` (a bad value becomes "argument --x: <why>" and exit status 2)
or adds a shared option to a parser. Nothing here imports torch, except `device` for a name that is not
'cpu': every argument is checked first, and a mistake refused in milliseconds.

One convention for the options every computing command takes (`add_compute_arguments`):

    --device DEVICE   cpu, cuda, cuda:N, mps or auto (default: cpu)
    --threads N       torch CPU threads (default: OMP_NUM_THREADS, else half the cores)
    --no-progress     no live progress bar: each stage as one line, as when the output is redirected

and one rule for `--model`'s default (`add_model_argument`): a command that reads an SAE or transcoders
runs the model they name; any other runs the smallest built-in model that can run it (toy, unless the
command needs more: minilm for parity, which transformers must load too; smollm2 for discover, which
needs a pre-norm decoder).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from pathlib import Path

from .checkpoints.names import BUILTIN_MODELS, misspelt
from .terminal import one_line
from .text import check_text

# Numbers ------------------------------------------------------------------------------------------


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


def within(kind, low, high, unit: str = "", why: str = ""):
    """An argparse type: a number of `kind` (positive_int, finite_float ...) from `low` to `high`; past
    `high`, "N `unit` is more than `high``why`" (why: what each costs) when a unit is named."""

    def check(value: str):
        number = kind(value)
        if number > high and unit:
            raise argparse.ArgumentTypeError(f"{number} {unit} is more than {high}{why}")
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low:,} and {high:,}")
        return number

    return check


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


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (a validation share, an Adam beta)."""
    value = probability(text)
    if value in (0.0, 1.0):
        raise argparse.ArgumentTypeError(f"{text} must be strictly between 0 and 1")
    return value


def fraction_or_one(text: str) -> float:
    """A number above 0 and at most 1 (a share of the steps, a per-layer LR factor)."""
    value = probability(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 (and at most 1)")
    return value


# Texts, files and folders -------------------------------------------------------------------------


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


# --threads, --device, --no-progress: what every computing command takes ----------------------------


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads(text: str) -> int:
    """An argparse type: torch CPU threads, 1 to the cores this process may use."""
    value = positive_int(text)
    if value > _cores():
        raise argparse.ArgumentTypeError(f"{value} threads: this machine gives this process {_cores()} core(s)")
    return value


def default_threads() -> int:
    """The torch threads a command computes with unless told: OMP_NUM_THREADS when it is set, else
    half the cores this process may use (at least 1). torch's own default, every core, is 10-50x
    slower the moment another program holds one (measured on this project's 2-core machine, one
    core busy: `analyze ig` on SmolLM2 24 s with 1 thread, 586 s with 2)."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) >= 1:
        return int(given)
    return max(1, _cores() // 2)


def set_threads(count: int) -> None:
    """torch's CPU threads for this command: set now if torch is loaded, else through OMP_NUM_THREADS,
    which torch (its OpenMP runtime) reads when it loads, so that a command's own checks of its
    arguments still come before the second that loading torch takes. Subprocesses inherit it."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    else:
        os.environ["OMP_NUM_THREADS"] = str(count)


DEVICE = re.compile(r"^(cpu|mps|auto|cuda)(:\d+)?$")


def device(text: str) -> str:
    """An argparse type: a torch device that exists on this machine ('auto': cuda, then mps, then cpu).
    A name no device has is refused before torch loads; whether a GPU is there, once it has."""
    if text == "cpu":
        return text  # checked without torch (the default of every command)
    if not DEVICE.match(text) or text.startswith("auto:"):
        raise argparse.ArgumentTypeError(f"{one_line(repr(text), 100)} is not a device (cpu, cuda, cuda:N, mps or auto)")
    import torch

    if text == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    parsed = torch.device(text)
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is available on this machine (use cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: Apple's MPS is not available on this machine (use cpu)")
    if parsed.type in ("cpu", "mps") and parsed.index not in (None, 0):
        raise argparse.ArgumentTypeError(f"{text!r}: there is one {parsed.type} device; give {parsed.type}")
    return str(parsed)


DEVICE_HELP = "where the model and every tensor live: cpu, cuda, cuda:N, mps or auto (default: cpu)"
THREADS_HELP = "torch CPU threads (default: {0}, from OMP_NUM_THREADS if set, else half the cores)"
NO_PROGRESS_HELP = "no live progress bar: each stage as one line with its time instead"


def add_device_argument(parser) -> None:
    """--device cpu|cuda|cuda:N|mps|auto (default cpu), checked to exist before anything is computed."""
    parser.add_argument("--device", type=device, default="cpu", metavar="DEVICE", help=DEVICE_HELP)


def add_threads_argument(parser) -> None:
    """--threads N: torch CPU threads for this command (the dispatcher sets them before it runs)."""
    parser.add_argument("--threads", type=threads, default=None, metavar="N", help=THREADS_HELP.format(default_threads()))


def add_progress_argument(parser) -> None:
    """--no-progress: stage lines (progress.Stages) instead of a live bar, on a terminal too."""
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)


def add_compute_arguments(parser, *, device: bool = True) -> None:
    """--device, --threads and --no-progress, with the same defaults and help in every command that
    computes. device=False: a command whose library computes on the CPU only (its help says why)."""
    if device:
        add_device_argument(parser)
    add_threads_argument(parser)
    add_progress_argument(parser)


# --model ------------------------------------------------------------------------------------------


def add_model_argument(parser, help: str = "", *, default: str | None = "toy", named_by: str | None = None,
                       flag: str = "--model", several: bool = False) -> None:
    """`flag` NAME_OR_PATH (--model; `anatomy train` says --init), resolved by anatomy.from_pretrained /
    anatomy.load_tokenizer, with the one rule for its default (the module docstring): `named_by` ("the
    SAE's files"): the model named there; else `default`, the smallest built-in model that runs the
    command; None: no model unless given. several: the flag may be given more than once (a list)."""
    if named_by:
        where, default = f" (default: the model named in {named_by})", None
    elif default:
        where = f" (default: {default}, the smallest built-in model that runs this command)"
    else:
        where = ""
    parser.add_argument(
        flag, default=default, metavar="NAME_OR_PATH", action="append" if several else "store", type=model_name,
        help=(help + "; " if help else "") + f"a built-in model ({', '.join(BUILTIN_MODELS)}), a checkpoint folder, "
        f"a .gguf file or a Hugging Face Hub id org/name{where}; `anatomy models` lists them",
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


__all__ = ["add_compute_arguments", "add_device_argument", "add_model_argument", "add_progress_argument",
           "add_threads_argument", "default_threads", "device", "finite_float", "input_file", "model_name",
           "non_negative_float", "non_negative_int", "output_file", "output_folder", "positive_float", "positive_int",
           "probability", "seed", "set_threads", "text", "threads", "within"]
