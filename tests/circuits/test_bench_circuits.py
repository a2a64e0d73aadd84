"""`anatomy bench --quick --only circuits`: anatomy's side alone when circuit-tracer is not installed (and says
so, installing nothing); beside circuit-tracer, the same adjacency, when $ANATOMY_CIRCUIT_TRACER_PYTHON names
its environment."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from anatomy.cli import main


def quick_table() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "circuits"]) == 0
    return out.getvalue()


def test_without_circuit_tracer_the_row_says_so_and_installs_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("ANATOMY_CIRCUIT_TRACER_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    table = quick_table()
    assert re.search(r"^\| circuits: pruned attribution graph, tiny Llama .*no circuit-tracer environment", table, re.M), table
    assert re.search(r"max \|diff\| [0-9.e-]+, at most [0-9.e-]+ of the terms it sums", table)
    assert not (tmp_path / "venv-circuit-tracer").exists()


@pytest.mark.peer("ANATOMY_CIRCUIT_TRACER_PYTHON")
def test_beside_circuit_tracer_the_adjacency_is_the_same():
    table = quick_table()
    differences = re.findall(r"same adjacency: max \|diff\| ([0-9.e+-]+)", table)
    assert len(differences) == 3 and all(float(d) < 1e-4 for d in differences), table  # whole, and capped at 16 and 48 tokens
    pruned = re.search(r"pruned (\d+) vs (\d+) nodes", table)
    assert pruned and pruned[1] == pruned[2]
