"""`anatomy bench --only discovery --quick` runs, and where auto-circuit's environment is there, both sides
score every edge alike."""

from __future__ import annotations

import re

from anatomy.bench.common import Settings
from anatomy.bench.discovery import autocircuit_python, side_by_side
from anatomy.bench.discovery_exact import acdc_side_by_side


def test_quick_side_by_side_row():
    row = side_by_side(Settings(quick=True, repeats=2))
    assert row.group == "discovery" and row.ours > 0 and row.theirs is None  # no speed-up in a smoke test
    python, _ = autocircuit_python(install=False)
    if python is not None:
        worst = float(re.search(r"max \|diff\| (\S+) over 110 edges", " ".join(row.notes)).group(1))
        assert worst < 1e-4
    else:
        assert "no auto-circuit environment" in " ".join(row.notes)


def test_quick_acdc_side_by_side_row():
    """ACDC on the bench's GPT-2-shaped model: where auto-circuit's environment is there, it keeps the same edges."""
    row = acdc_side_by_side(Settings(quick=True, repeats=1))
    assert row.ours > 0 and row.theirs is None and re.search(r"\d+ of 110 edges kept", " ".join(row.notes))
    python, _ = autocircuit_python(install=False)
    if python is not None:
        assert "the same edges" in " ".join(row.notes)
