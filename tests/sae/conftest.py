"""Fixtures of the SAE tests: the analysis tests' tiny models of every family (tests/analysis/analysis_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "analysis"))
from analysis_models import FAMILIES, tiny  # noqa: E402


@pytest.fixture(params=list(FAMILIES))
def family_model(request):
    return tiny(**FAMILIES[request.param])
