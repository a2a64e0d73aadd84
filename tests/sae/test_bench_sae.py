"""`anatomy bench --quick --only sae` runs without SAELens and says so; the harvested values are the pass's."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from anatomy.cli import main


@pytest.mark.slow
def test_the_sae_group_runs_quick_and_names_what_it_compared(monkeypatch, tmp_path):
    monkeypatch.delenv("ANATOMY_SAELENS_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))  # no cached SAELens environment, and --quick makes none
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "sae"]) == 0
    table = out.getvalue()
    assert re.search(r"^\| sae: harvest .* values equal to the full pass's trace: yes \|$", table, re.M), table
    assert re.search(r"^\| sae: train TopK SAE .*no SAELens comparison", table, re.M), table
    assert not (tmp_path / "venv-saelens").exists()
    assert re.search(r"^\| sae: harvest every layer's MLP in and out .* the same values either way: yes", table, re.M), table
    assert re.search(r"^\| sae: train 2 BatchTopK SAEs from one stream .*no SAELens comparison", table, re.M), table
    assert re.search(r"^\| sae: train a skip transcoder on all 4 layers .* tokens an hour", table, re.M), table
