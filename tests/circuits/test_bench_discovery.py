"""`anatomy bench --only discovery --quick` runs, and where auto-circuit's environment is there, both sides
score every edge alike."""

from __future__ import annotations

import re

from anatomy.bench.common import Settings
from anatomy.bench.discovery import side_by_side
from anatomy.bench.peers import peer_python


def test_quick_side_by_side_row():
    row = side_by_side(Settings(quick=True, repeats=2))
    assert row.group == "discovery" and row.ours > 0 and row.theirs is None  # no speed-up in a smoke test
    python, _ = peer_python("auto-circuit", install=False)
    if python is not None:
        worst = float(re.search(r"max \|diff\| (\S+) over 110 edges", " ".join(row.notes)).group(1))
        assert worst < 1e-4
    else:
        assert "no auto-circuit environment" in " ".join(row.notes)
