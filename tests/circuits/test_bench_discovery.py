"""`anatomy bench --only discovery --quick` runs: without auto-circuit's environment the row says so, and beside
it (its python in $ANATOMY_AUTOCIRCUIT_PYTHON) both sides score every edge alike."""

from __future__ import annotations

import re

import pytest

from anatomy.bench.common import Settings
from anatomy.bench.discovery import side_by_side
from anatomy.bench.discovery_exact import acdc_side_by_side


def test_without_auto_circuit_the_row_says_so_and_installs_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("ANATOMY_AUTOCIRCUIT_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    row = side_by_side(Settings(quick=True, repeats=2))
    assert row.group == "discovery" and row.ours > 0 and row.theirs is None  # no speed-up in a smoke test
    assert "no auto-circuit environment" in " ".join(row.notes)
    assert not (tmp_path / "venv-auto-circuit").exists()


@pytest.mark.peer("ANATOMY_AUTOCIRCUIT_PYTHON")
def test_beside_auto_circuit_every_edge_scores_alike():
    row = side_by_side(Settings(quick=True, repeats=2))
    assert row.ours > 0 and row.theirs is None
    worst = float(re.search(r"max \|diff\| (\S+) over 110 edges", " ".join(row.notes)).group(1))
    assert worst < 1e-4


def test_without_auto_circuit_the_acdc_row_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv("ANATOMY_AUTOCIRCUIT_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    row = acdc_side_by_side(Settings(quick=True, repeats=1))
    assert row.ours > 0 and row.theirs is None and re.search(r"\d+ of 110 edges kept", " ".join(row.notes))
    assert "no auto-circuit environment" in " ".join(row.notes)


@pytest.mark.peer("ANATOMY_AUTOCIRCUIT_PYTHON")
def test_beside_auto_circuit_acdc_keeps_the_same_edges():
    row = acdc_side_by_side(Settings(quick=True, repeats=1))
    assert "the same edges" in " ".join(row.notes)
