"""`anatomy circuits discover` (every method, --verify with --outside, --roles, the faithfulness curve, the
files written) and `anatomy analyze` (every analysis) make nothing off the model's device: each command runs
with the default device set to meta while the model is on the CPU (device_check), and prints and writes what
the plain run does. A task's ids, a padding mask, an arange or a table made without the device of what it
meets is a meta tensor there, and fails as a CPU tensor fails beside a CUDA model."""

from __future__ import annotations

import json
import re

import pytest
from device_check import off_the_models_device
from safetensors import safe_open

import anatomy
import anatomy.checkpoints
from anatomy.cli import main

PAIRS = [{"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"},
         {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " this"}]

DISCOVER = {  # every method, each option of the floor at least once
    "eap-ig": ["--steps", "2", "--verify", "3", "--outside", "3", "--roles", "2", "--out", "circuit.html"],
    "eap-ig-edges-mean": ["--path", "edges", "--steps", "2", "--ablation", "mean", "--out", "circuit.safetensors"],
    "eap": ["--method", "eap", "--edges", "3", "--verify", "2", "--roles", "1"],
    "acdc": ["--method", "acdc", "--threshold", "0.001", "--out", "acdc.safetensors"],
    "acdc-task-mean": ["--method", "acdc", "--threshold", "0.001", "--distance", "task", "--ablation", "mean"],
    "atp": ["--method", "atp", "--verify", "2", "--roles", "2", "--out", "nodes.html"],
    "atp*-q": ["--method", "atp*", "--nodes", "q", "--verify", "2"],
    "atp*-k": ["--method", "atp*", "--nodes", "k"],
    "ig-neurons": ["--method", "ig", "--nodes", "neurons", "--steps", "2", "--verify", "2"],
    "atp-v-mlp": ["--method", "atp", "--nodes", "v", "--verify", "2"],
}
TEXT = "Hello World, this is"
ANALYZE = {
    "lens": ["lens", TEXT], "decompose": ["decompose", TEXT], "dla": ["dla", TEXT], "ig": ["ig", TEXT, "--steps", "3"],
    "gxi": ["gxi", TEXT], "rollout": ["rollout", TEXT], "heads": ["heads", "--kind", "induction"],
    "patch": ["patch", "--clean", TEXT, "--corrupt", "Hello World, is this", "--point", "attn.z", "--by", "head"],
}


@pytest.fixture(scope="module")
def loaded(prenorm):
    """The pre-norm toy, loaded once on the CPU (before the default device is meta)."""
    return anatomy.from_pretrained(prenorm).eval()


def run(argv: list[str], model, monkeypatch, capsys, folder, on_meta: bool) -> tuple[str, dict[str, bytes]]:
    """(what the command printed, the timings left out; the files it wrote), run plainly or off the device."""
    monkeypatch.setattr(anatomy.checkpoints, "from_pretrained", lambda *args, **kwargs: model)
    folder.mkdir()
    argv = [str(folder / arg) if re.fullmatch(r"\w+\.(html|safetensors)", arg) else arg for arg in argv]
    if on_meta:
        with off_the_models_device():
            assert main(argv) == 0
    else:
        assert main(argv) == 0
    printed = capsys.readouterr().out
    printed = "\n".join(line for line in printed.split("\n  time ")[0].splitlines() if not line.startswith("["))
    return printed.replace(str(folder), "OUT"), {path.name: contents(path) for path in folder.iterdir()}


def contents(path) -> object:
    """A file's bytes; a .safetensors file's header and tensors' bytes (its header's order varies from one
    write to the next)."""
    if path.suffix != ".safetensors":
        return path.read_bytes()
    with safe_open(path, "pt") as file:
        return file.metadata(), {name: file.get_tensor(name).numpy().tobytes() for name in file.keys()}


@pytest.mark.parametrize("case", DISCOVER)
def test_discovery_makes_nothing_off_the_models_device(case, prenorm, loaded, tmp_path, monkeypatch, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(pair) for pair in PAIRS) + "\n", encoding="utf-8")
    argv = ["circuits", "discover", "--task", str(pairs), "--model", prenorm, *DISCOVER[case]]
    plain = run(argv, loaded, monkeypatch, capsys, tmp_path / "plain", on_meta=False)
    assert run(argv, loaded, monkeypatch, capsys, tmp_path / "meta", on_meta=True) == plain
    assert "2 pairs kept" in plain[0] and ("--out" not in argv or plain[1])


@pytest.mark.parametrize("case", ANALYZE)
def test_analyses_make_nothing_off_the_models_device(case, prenorm, loaded, tmp_path, monkeypatch, capsys):
    argv = ["analyze", *ANALYZE[case], "--model", prenorm, "--out", "view.html"]
    plain = run(argv, loaded, monkeypatch, capsys, tmp_path / "plain", on_meta=False)
    assert run(argv, loaded, monkeypatch, capsys, tmp_path / "meta", on_meta=True) == plain
    assert "check:" in plain[0] and plain[1]["view.html"]
