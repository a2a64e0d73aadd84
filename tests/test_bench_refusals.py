"""`anatomy bench --only refusals` runs (quick mode) and says what each side did with each hostile
file; it asserts no time (a shared machine cannot), only that every refusal is a refusal."""

import contextlib
import io
import re

import pytest

pytest.importorskip("transformers")

from anatomy.bench.refusals import MISTAKES  # noqa: E402
from anatomy.cli import main  # noqa: E402


def test_the_refusals_group_measures_every_mistake_and_both_hostile_files():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "refusals"]) == 0
    text = out.getvalue()
    for what in MISTAKES:
        assert re.search(rf"^\| refusals: the command line: {re.escape(what)} \| ms \|", text, re.M), what
    assert "importing torch" in text
    hostile = [line for line in text.splitlines() if line.startswith("| refusals: hostile checkpoint")]
    assert len(hostile) == 2 and all("anatomy: CheckpointError" in line for line in hostile), hostile
