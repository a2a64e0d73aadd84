"""What a long command is doing, as it does it: the one progress display of the command line.

A command names its stages as they start; a stage that counts its work gets a callback, the
`progress(done, total)` every long function of the library takes:

    with Stages.of(args) as stages:                  # quiet=args.quiet, bar=not args.no_progress
        stages.start("loading the model")
        model = ...
        graph = attribution_graph(..., progress=stages.start("the graph", unit="layers"))
    stages.times()            # "loading the model 3.1 s, the graph 41.0 s": the summary's row

Where the lines go (`stream`, stdout unless the command's stdout is its product) decides the form:
- a terminal, with stderr one too: a live bar on stderr (the stage, done/total, elapsed, ETA) that
  disappears when the command is done;
- redirected (`anatomy circuits discover ... > log`), or --no-progress: one line per stage as it starts,
  flushed at once, "[ 12.3 s] loading the model …", the time since the command began (a short command
  whose stdout is its product, `walk` or `generate`, says its stages redirected only when asked, by
  --no-progress: its stderr stays its notes and its errors);
- quiet: nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from .terminal import one_line

Progress = Callable[[int, int], None]  # (done, total): what the library's long functions call


class Stages:
    """The stages of one command (module docstring); a context manager around the work."""

    def __init__(self, *, quiet: bool = False, bar: bool = True, stream=None, redirected: bool = True):
        self.stream = stream if stream is not None else sys.stdout
        self.quiet = quiet or (bar and not redirected and not _is_terminal(self.stream))
        self.began = time.perf_counter()
        self.seconds: dict[str, float] = {}  # each stage's time, in order: the summary reads it
        self._current: tuple[str, float] | None = None
        self._bar = None
        if not quiet and bar and _is_terminal(self.stream) and _is_terminal(sys.stderr):
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.fields[count]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._task = None

    @classmethod
    def of(cls, args, stream=None, redirected: bool = True) -> Stages:
        """The stages of a command, as its options ask (--quiet, --no-progress). redirected=False: no line
        where the output is redirected unless --no-progress asks for them (the module docstring)."""
        return cls(quiet=getattr(args, "quiet", False), bar=not getattr(args, "no_progress", False), stream=stream,
                   redirected=redirected)

    def __enter__(self) -> Stages:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._finish()
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def start(self, label: str, unit: str = "") -> Progress:
        """Begin the stage `label` (the one before ends); returns its progress(done, total) callback,
        which shows "done/total unit" on the bar (and nothing in the lines)."""
        self._finish()
        now = time.perf_counter()
        self._current = (label, now)
        if self.quiet:
            return _nothing
        if self._bar is None:
            print(f"[{now - self.began:5.1f} s] {one_line(label, 66)} …", file=self.stream, flush=True)
            return _nothing
        if self._task is not None:
            self._bar.remove_task(self._task)
        task = self._task = self._bar.add_task(one_line(label, 40), total=None, count="")

        def progress(done: int, total: int) -> None:
            self._bar.update(task, completed=done, total=total, count=f"{done:,}/{total:,} {unit}".rstrip())

        return progress

    @contextmanager
    def handed_over(self):
        """A block in which another display has the terminal (a trainer's own bar): the live bar stops
        for it, and comes back after."""
        if self._bar is not None:
            self._bar.stop()
        try:
            yield
        finally:
            if self._bar is not None:
                self._bar.start()

    def times(self) -> str:
        """Each stage ended so far and its time, "loading the model 3.1 s, the graph 41.0 s": a summary's row."""
        self._finish()
        # a no-break space, which folding (terminal.summary_block) never breaks at, holds "graph 41.0 s" together
        return ", ".join(f"{label}\u00a0{seconds:.1f}\u00a0s" for label, seconds in self.seconds.items())

    def _finish(self) -> None:
        if self._current is not None:
            label, started = self._current
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started
            self._current = None


def _nothing(done: int, total: int) -> None:
    return None


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


__all__ = ["Progress", "Stages"]
