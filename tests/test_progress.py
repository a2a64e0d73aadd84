"""The command line's one progress display (anatomy.progress.Stages): a line per stage, flushed as the stage
starts, where the output is redirected; a live bar, and no line, on a terminal; nothing when quiet."""

from __future__ import annotations

import io
import re
import sys

from anatomy.progress import Stages

LINE = re.compile(r"^\[ *(\d+\.\d) s\] (.+) …$")


class Log(io.StringIO):
    """A redirected stream that records what was flushed, and when."""

    def __init__(self, tty: bool = False):
        super().__init__()
        self.tty, self.flushed = tty, []

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_a_redirected_stream_gets_one_flushed_line_per_stage_as_it_starts():
    log = Log()
    with Stages(stream=log) as stages:
        stages.start("loading the model")
        assert log.flushed[-1].endswith("loading the model …\n")  # there before the stage's work, not at the end
        progress = stages.start("the graph", "layers")
        progress(3, 30)  # a count is the bar's; a log gets no line for it
        stages.start("writing \x1b[2J")
    lines = log.getvalue().splitlines()
    assert [LINE.match(line)[2] for line in lines] == ["loading the model", "the graph", "writing \\x1b[2J"]
    times = [float(LINE.match(line)[1]) for line in lines]
    assert times == sorted(times) and len(log.flushed) == 3


def test_no_progress_gives_the_lines_on_a_terminal_too():
    log = Log(tty=True)
    with Stages(stream=log, bar=False) as stages:
        stages.start("loading the model")
    assert LINE.match(log.getvalue().strip())


def test_a_terminal_gets_a_bar_and_no_line(monkeypatch):
    log = Log(tty=True)
    monkeypatch.setattr(sys, "stderr", Log(tty=True))
    with Stages(stream=log) as stages:
        stages.start("loading the model")
        progress = stages.start("the graph", "layers")
        progress(3, 30)
        assert stages._bar is not None and stages._bar.tasks[-1].completed == 3
        assert stages._bar.tasks[-1].fields["count"] == "3/30 layers"
    assert log.getvalue() == ""


def test_quiet_says_nothing_and_still_times_the_stages():
    log = Log()
    with Stages(stream=log, quiet=True) as stages:
        stages.start("loading the model")(1, 2)
        stages.start("the graph")
    assert log.getvalue() == "" and list(stages.seconds) == ["loading the model", "the graph"]
    assert re.fullmatch(r"loading the model\u00a0\d+\.\d\u00a0s, the graph\u00a0\d+\.\d\u00a0s", stages.times())


def test_a_stage_handed_over_to_another_display_comes_back(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Log(tty=True))
    with Stages(stream=Log(tty=True)) as stages:
        stages.start("training")
        with stages.handed_over():
            assert not stages._bar.live.is_started  # the trainer's bar may start: one live display at a time
        assert stages._bar.live.is_started


def test_a_short_command_says_its_stages_redirected_only_when_asked():
    """walk and generate: stdout is the product, stderr the notes and errors; --no-progress asks for the lines."""
    log = Log()
    with Stages(stream=log, redirected=False) as stages:
        stages.start("loading the model")
    assert log.getvalue() == ""
    with Stages(stream=log, redirected=False, bar=False) as stages:
        stages.start("loading the model")
    assert LINE.match(log.getvalue().strip())
