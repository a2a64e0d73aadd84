"""`anatomy parity` and `anatomy models`: the checkpoints floor on the command line.

    anatomy parity --model minilm                    # every intermediate against transformers
    anatomy parity path/to/checkpoint --pad --tol 1e-5
    anatomy models                                   # the built-in names and the architectures read

The library half of parity (pairing trace points with transformers' outputs) is parity.py.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import textwrap

from ..arguments import add_compute_arguments, add_model_argument, model_name, non_negative_float, non_negative_int, text
from ..progress import Stages
from ..terminal import one_line
from .names import BUILTIN_MODELS

# The checkpoints, transformers and torch are imported by the functions that use them, once the
# arguments have been checked (anatomy.lazy): a mistake is refused in milliseconds.

# parity -------------------------------------------------------------------------------------------


def add_parity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_path", metavar="MODEL", nargs="?", default=None, type=model_name,
                        help="the same as --model")
    add_model_argument(parser, default="minilm", help="a checkpoint transformers can also load")
    add_compute_arguments(parser, device=False)  # both libraries run on the CPU, where transformers is the reference
    parser.add_argument("--text", type=text, action="append", help="input text (repeat for a batch); default: a "
                        "pangram, cut to the model's positions if longer")
    parser.add_argument("--text-b", type=text, help="second segment (BERT) or target text (Marian)")
    parser.add_argument("--tol", type=non_negative_float, default=1e-5,
                        help="largest allowed max |difference|")
    parser.add_argument("--pad", action="store_true", help="batch two texts of different lengths, with padding")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed for random ids when the checkpoint has no tokenizer")


def run_parity(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .describe import config_of
    from .parity import parity_rows
    from .toys import TOY_MODELS

    model = args.model_path or args.model
    if args.model_path and args.model not in ("minilm", args.model_path):
        raise ValueError(f"two models given: {args.model_path!r} and --model {args.model!r}; give one")
    if model in TOY_MODELS:
        raise ValueError(f"{model} is anatomy's own toy, which transformers has no class for: parity takes a "
                         "Hugging Face folder, a .gguf file, a Hub id, minilm or smollm2")
    config = config_of(model)  # a misspelt name, a missing path or an unreadable config: refused before anything loads
    if args.text_b is not None and config is not None and config.arch == "decoder":
        raise ValueError(f"--text-b is a second segment (an encoder) or a target (an encoder-decoder); "
                         f"{one_line(model, 100)} is a decoder, which reads one text: give --text only")
    console = Console(highlight=False)
    notes: list[str] = []
    with Stages.of(args, sys.stderr) as stages:  # the table alone goes to stdout
        rows = parity_rows(model, args.text, args.text_b, args.pad, args.tol, args.seed, notes=notes,
                           progress=lambda stage: stages.start(stage))
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=True)
    name = escape(one_line(model))
    table = Table(title=f"anatomy vs transformers: {name}" + (" (padded batch)" if args.pad else ""))
    for column in ("anatomy", "transformers", "shape", "max |diff|", ""):
        table.add_column(column, justify="right" if column == "max |diff|" else "left")
    for row in rows:
        table.add_row(row.name, row.reference, "×".join(map(str, row.shape)), f"{row.max_abs_diff:.2e}",
                      "[green]ok[/green]" if row.ok else "[red]FAIL[/red]")
    console.print(table)
    console.print(summary(rows, args.tol), soft_wrap=True)
    return 0 if all(row.ok for row in rows) else 1


def summary(rows, tol: float) -> str:
    """One line: how many intermediates, the worst difference (NaN if any is NaN), the verdict."""
    failed = [row for row in rows if not row.ok]
    nan = sum(math.isnan(row.max_abs_diff) for row in rows)
    worst = "NaN" if nan else f"{max((row.max_abs_diff for row in rows), default=0.0):.2e}"
    return (f"{len(rows)} intermediates, worst {worst}" + (f" ({nan} NaN)" if nan else "")
            + f", tolerance {tol:.0e}: "
            + ("[green]all within[/green]" if not failed else f"[red]{len(failed)} beyond[/red]"))


# models -------------------------------------------------------------------------------------------


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the list is short."""


def run_models(args: argparse.Namespace) -> int:
    print(models_text(shutil.get_terminal_size().columns))
    return 0


def models_text(width: int = 80) -> str:
    """The built-in names and the architectures read, each entry a name then its text, wrapped to
    `width` columns (at most 80) under a hanging indent; class names are never split."""
    from .registry import ARCHITECTURES

    width = min(width, 80)

    def entries(rows) -> list[str]:
        return [textwrap.fill(text, width, initial_indent=f"  {name:<12} ", subsequent_indent=" " * 15,
                              break_long_words=False, break_on_hyphens=False) for name, text in rows]

    classes = ((model_type, ", ".join(arch.classes)) for model_type, arch in sorted(ARCHITECTURES.items()))
    return "\n".join([
        textwrap.fill("Built-in models (--model NAME, anatomy.from_pretrained(NAME)):", width),
        *entries(BUILTIN_MODELS.items()), "",
        textwrap.fill("Architectures read from a checkpoint folder, a .gguf file or a Hub id (config.json "
                      "model_type):", width),
        *entries(classes),
    ])
