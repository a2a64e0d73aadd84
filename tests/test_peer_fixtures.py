"""The fixtures the parity tests compare anatomy with are what the peers compute today, not what they computed on a
developer's machine once: each fixture script, the committed one, runs in its peer's environment (`python -m
anatomy.bench.peers`; .ci/run builds them) into a fresh folder, and every file it writes equals the committed one:
tensors and JSON numbers within 1e-5 of their scale (circuit-tracer's adjacency comes back with float32 round-off
of another summation order), everything else byte for byte. Version stamps are not compared.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TESTS = Path(__file__).parent
SCRIPTS = {  # script -> (the peer's variable, the folder it writes when given none)
    "circuits/fixtures/make_graph_fixtures.py": ("ANATOMY_CIRCUIT_TRACER_PYTHON", "circuits/fixtures/graphs"),
    "circuits/fixtures/make_autocircuit_fixtures.py": ("ANATOMY_AUTOCIRCUIT_PYTHON", "circuits/fixtures/autocircuit"),
    "sae/fixtures/make_circuit_tracer_fixtures.py": ("ANATOMY_CIRCUIT_TRACER_PYTHON", "sae/fixtures/circuit_tracer"),
    "sae/fixtures/make_saelens_fixtures.py": ("ANATOMY_SAELENS_PYTHON", "sae/fixtures"),
}
RELATIVE = 1e-5


def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
        return False
    if not theirs.is_floating_point():
        return torch.equal(ours, theirs)
    scale = max(1.0, float(theirs.abs().max())) if theirs.numel() else 1.0
    return bool((ours.double() - theirs.double()).abs().max() <= RELATIVE * scale) if theirs.numel() else True


def same_json(ours, theirs, scale: float = 1.0) -> bool:
    if isinstance(theirs, dict):
        keys = {key for key in theirs if "version" not in key}
        return (keys == {key for key in ours if "version" not in key}
                and all(same_json(ours[key], theirs[key]) for key in keys))
    if isinstance(theirs, list):
        numbers = [abs(v) for v in theirs if isinstance(v, (int, float)) and not isinstance(v, bool)]
        scale = max([1.0, *numbers])
        return (isinstance(ours, list) and len(ours) == len(theirs)
                and all(same_json(a, b, scale) for a, b in zip(ours, theirs)))
    if isinstance(theirs, float) or (isinstance(ours, float) and isinstance(theirs, int)):
        return isinstance(ours, (int, float)) and abs(ours - theirs) <= RELATIVE * max(scale, abs(theirs))
    return ours == theirs


def differences(written: Path, committed: Path) -> list[str]:
    found = []
    for path in sorted(p for p in written.rglob("*") if p.is_file()):
        name = path.relative_to(written).as_posix()
        other = committed / name
        if not other.is_file():
            found.append(f"{name}: not committed")
        elif path.suffix == ".safetensors":
            ours, theirs = load_file(str(path)), load_file(str(other))
            if ours.keys() != theirs.keys() or not all(close(ours[key], theirs[key]) for key in theirs):
                found.append(f"{name}: other tensors")
        elif path.suffix == ".json":
            if not same_json(*(json.loads(p.read_text(encoding="utf-8")) for p in (path, other))):
                found.append(f"{name}: other JSON")
        elif not filecmp.cmp(path, other, shallow=False):
            found.append(f"{name}: other bytes")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("script", [pytest.param(script, marks=pytest.mark.peer(variable))
                                    for script, (variable, _) in SCRIPTS.items()])
def test_the_committed_fixtures_are_what_the_peer_writes_today(script, tmp_path):
    variable, folder = SCRIPTS[script]
    done = subprocess.run([os.environ[variable], str(TESTS / script), str(tmp_path / "written")],
                          capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "written").rglob("*.safetensors")), "the script wrote no tensors"
    assert not differences(tmp_path / "written", TESTS / folder)
