"""The `anatomy` command.

Each subcommand lives beside the concept it exposes and provides two functions:
`add_arguments(parser)` and `run(args) -> int`. They are imported only when used, so
`anatomy walk` never pays for importing the trainer or the browser views.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "walk": ("anatomy.walk.cli", "narrate one forward pass, step by step, with the real numbers"),
    "viz": ("anatomy.viz.cli", "write a self-contained attention view (HTML) or a static image"),
    "parity": ("anatomy.checkpoints.parity", "compare every intermediate with Hugging Face transformers"),
    "train": ("anatomy.training.cli", "train a language model, a translator or a classifier"),
    "generate": ("anatomy.generation.cli", "generate text from a trained or pretrained model"),
    "bench": ("anatomy.bench.cli", "benchmark anatomy against Hugging Face transformers"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (None: list commands only)."""
    parser = argparse.ArgumentParser(
        prog="anatomy",
        description="The Transformer, taken apart: run, trace, narrate and view every step.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name != command:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # An optional extra is missing: say which, instead of a traceback.
            sub_parser.set_defaults(_missing=str(error))
            continue
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["walk"]  # the main job: narrate the seed 004 toy model
    command = argv[0] if argv[0] in SUBCOMMANDS else None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.exit(2, f"anatomy {args.command}: unavailable, a dependency is missing ({args._missing})\n")
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
