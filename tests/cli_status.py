"""The exit status of `anatomy ARGUMENTS` as a user sees it: argparse's mistakes exit (SystemExit),
anatomy's own commands return theirs."""

from anatomy.cli import main


def status(arguments: list[str]) -> int:
    try:
        return main(arguments)
    except SystemExit as stop:
        return stop.code
