"""Refusals: how long a mistake or a hostile file takes to be told no.

- **the command line**: a mistake (a bad number, an empty text, a misspelt model, a misspelt command)
  and `--help`, each in a fresh process, as a person types them. Every one is refused by the parser
  before torch is imported. No peer has this command line; the notes give the floor: Python alone,
  and Python importing torch, which is what every refusal cost before.
- **hostile checkpoints**, in one process with the libraries already imported: a safetensors file
  whose header names 200,000 empty extra tensors (16 MB of JSON), and an index naming 50,000 shards
  that are not there, opened by anatomy.from_pretrained and by transformers' from_pretrained.
  transformers loads the first, ignoring the extra tensors, and refuses the second.
Each time is the fastest of `repeats` runs (noise only adds).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Row, Settings, load_average

MISTAKES = {
    "a bad number (walk --layer x)": ["walk", "--layer", "x"],
    "an empty text (analyze lens '')": ["analyze", "lens", ""],
    "a misspelt model (walk --model smolm2)": ["walk", "--model", "smolm2"],
    "a misspelt command (wlak)": ["wlak"],
    "an option of the wrong strategy (generate --top-k 0)": ["generate", "--top-k", "0"],
    "help (train lm --help)": ["train", "lm", "--help"],
}


def _fastest_process(argv: list[str], repeats: int) -> float:
    best = float("inf")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], capture_output=True, env=env, cwd=tempfile.gettempdir())
        best = min(best, time.perf_counter() - start)
    return best


def _fastest_call(fn, repeats: int) -> tuple[float, str]:
    """(seconds of the fastest call, what the call ended in: 'loaded' or the error's first words)."""
    best, outcome = float("inf"), ""
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            fn()
            outcome = "loaded"
        except Exception as error:  # noqa: BLE001 - each library refuses in its own words
            outcome = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
        best = min(best, time.perf_counter() - start)
    return best, outcome


def _tiny_gpt2(directory: Path) -> dict:
    """A tiny random GPT-2 saved by transformers into `directory`; returns its tensors."""
    import torch
    import transformers  # optional extra: bench
    from safetensors.torch import load_file

    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    ).save_pretrained(directory)
    return load_file(directory / "model.safetensors")


def _with_empty_tensors(directory: Path, extra: int) -> None:
    tensors = _tiny_gpt2(directory)
    header, data = {}, b""
    for name, tensor in tensors.items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header.update({f"extra.{i}": {"dtype": "F32", "shape": [0], "data_offsets": [len(data)] * 2} for i in range(extra)})
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _with_missing_shards(directory: Path, shards: int) -> None:
    _tiny_gpt2(directory)
    (directory / "model.safetensors").unlink()
    weight_map = {f"t.{i}": f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def bench_refusals(settings: Settings) -> list[Row]:
    repeats = 2 if settings.quick else max(3, settings.repeats or 5)
    floor = {"python": _fastest_process(["-c", "pass"], repeats),
             "import torch": _fastest_process(["-c", "import torch"], repeats)}
    context = (f"fresh process; Python alone {floor['python'] * 1000:.0f} ms, importing torch "
               f"{floor['import torch'] * 1000:.0f} ms")
    rows = [Row("refusals", f"the command line: {what}", "ms",
                _fastest_process(["-m", "anatomy.cli", *argv], repeats) * 1000, None, higher_is_better=False,
                notes=[context, f"load {load_average()}"])
            for what, argv in MISTAKES.items()]

    import anatomy
    import transformers  # optional extra: bench

    with tempfile.TemporaryDirectory() as folder:  # both libraries' lazy imports, out of the timing
        _tiny_gpt2(Path(folder))
        anatomy.from_pretrained(folder)
        transformers.AutoModelForCausalLM.from_pretrained(folder)
    extra, shards = (2_000, 500) if settings.quick else (200_000, 50_000)
    for case, make in ((f"a header naming {extra:,} empty extra tensors", lambda d: _with_empty_tensors(d, extra)),
                       (f"an index naming {shards:,} missing shards", lambda d: _with_missing_shards(d, shards))):
        with tempfile.TemporaryDirectory() as folder:
            make(Path(folder))
            ours, our_outcome = _fastest_call(lambda: anatomy.from_pretrained(folder), repeats)
            theirs, their_outcome = _fastest_call(lambda: transformers.AutoModelForCausalLM.from_pretrained(folder),
                                                  max(1, repeats // 2))
        rows.append(Row("refusals", f"hostile checkpoint: {case}", "s", ours, theirs, higher_is_better=False,
                        notes=[f"anatomy: {our_outcome}", f"transformers: {their_outcome}", f"load {load_average()}"]))
    return rows
