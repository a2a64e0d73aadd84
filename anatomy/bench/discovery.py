"""Circuit discovery: EAP-IG side by side with auto-circuit, and the SmolLM2 IOI goals.

Rows:

- **EAP-IG, every edge, side by side with auto-circuit 1.0.1** on a random GPT-2-shaped model both open
  (6 layers x 384, 6 heads; 32 pairs of 16 tokens; 5 samples): the same quantity on both sides (the edge
  masks interpolated together, anatomy's path="edges"), seconds per call, and the largest difference of
  the scores (anatomy's mean times the 6 points against auto-circuit's sum). auto-circuit needs
  TransformerLens 2.x, so it runs in its own environment: $ANATOMY_AUTOCIRCUIT_PYTHON, else one the bench
  makes under the cache (venv-auto-circuit, peers.py); without either the row says why.
- **SmolLM2-135M, IOI, 100 pairs** (not in --quick): EAP-IG with 5 steps over every edge (goal: 2 minutes
  with 2 threads), exact path patching of its top 50 edges, each run from its destination's layer (goal:
  1 minute), and AtP*'s Spearman rho
  against exact activation patching on the top 20 heads (goal: 0.8). One run each: minutes long, timed
  once, with the load average beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from .common import Row, Settings, load_average
from .peers import peer_python

WORKER = Path(__file__).with_name("autocircuit_worker.py")


def _pairs(vocab: int, n: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, vocab, (n, length), generator=generator)
    corrupt = clean.clone()
    corrupt[:, 2:5] = torch.randint(0, vocab, (n, 3), generator=generator)
    return {"clean": clean, "corrupt": corrupt, "answers": torch.randint(0, vocab, (n, 1), generator=generator),
            "wrongs": torch.randint(0, vocab, (n, 1), generator=generator)}


def side_by_side(settings: Settings) -> Row:
    from safetensors.torch import save_file

    from transformers import GPT2Config, GPT2LMHeadModel

    from ..checkpoints import from_pretrained
    from ..circuits.discovery import Task, attribute_edges

    layers, width, heads, n, length = (2, 32, 4, 4, 8) if settings.quick else (6, 384, 6, 32, 16)
    samples = 5
    case = f"EAP-IG ({samples} samples, edges interpolated), every edge, GPT-2 {layers} x {width}, {n} x {length}"
    python, how = peer_python("auto-circuit", install=not settings.quick)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=1000, n_positions=64)
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory) / "gpt2"
        GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
        pairs = _pairs(1000, n, length)
        save_file(pairs, str(Path(directory) / "pairs.safetensors"))
        model = from_pretrained(folder).eval()
        task = Task("bench", pairs["clean"], pairs["corrupt"], torch.full((n,), length), pairs["answers"], pairs["wrongs"])
        runs = []
        theirs, notes = None, [how]
        for _ in range(1 if settings.quick else 2):
            started = time.perf_counter()
            result = attribute_edges(model, task, method="eap-ig", steps=samples, path="edges")
            runs.append(time.perf_counter() - started)
        ours = min(runs)
        if python is not None:
            out = Path(directory) / "theirs.json"
            completed = subprocess.run([python, str(WORKER), str(folder), str(Path(directory) / "pairs.safetensors"),
                                        str(samples), str(out)], capture_output=True, text=True, timeout=3600,
                                       env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
            if completed.returncode:
                notes.append(f"auto-circuit failed: {completed.stderr.strip()[-200:]}")
            else:
                reply = json.loads(out.read_text(encoding="utf-8"))
                theirs = reply["seconds"]
                graph = result.extra["graph"]
                names = {graph.edge_name(u, v): (u, v) for u, v in graph.allowed.nonzero().tolist()}
                worst = max(abs(float(result.values[names[name]]) * (samples + 1) - value)
                            for name, value in reply["scores"].items())
                notes.append(f"max |diff| {worst:.1e} over {len(reply['scores'])} edges")
    return Row("discovery", case, "s", ours, None if settings.quick else theirs, False, notes)


def smollm2(settings: Settings) -> list[Row]:
    from ..checkpoints import from_pretrained
    from ..circuits.discovery import attribute_edges, attribute_nodes, ioi, verify_edges, verify_nodes

    model = from_pretrained("smollm2").eval()
    task = ioi(model, 100)
    rows = []
    started = time.perf_counter()
    edges = attribute_edges(model, task, method="eap-ig", steps=5)
    seconds = time.perf_counter() - started
    rows.append(Row("discovery", f"SmolLM2 IOI ({len(task)} pairs), EAP-IG 5 steps, {edges.extra['graph'].edge_count:,} edges",
                    "s", seconds, None, False, [f"{torch.get_num_threads()} threads; goal 120 s; load {load_average()}"]))
    started = time.perf_counter()
    checked = verify_edges(model, task, edges, 50)
    seconds = time.perf_counter() - started
    rows.append(Row("discovery", "SmolLM2 IOI, exact path patching of the top 50 edges, each from its layer", "s",
                    seconds, None, False, [f"goal 60 s; {checked.check}; load {load_average()}"]))
    star = attribute_nodes(model, task, kind="heads", method="atp*")
    exact = verify_nodes(model, task, star, 20)
    rows.append(Row("discovery", "SmolLM2 IOI, AtP* on heads: Spearman rho of the top 20 against exact patching",
                    "rho", exact.extra["spearman"], None, True, [f"goal 0.8; {exact.check}"]))
    return rows


def bench_discovery(settings: Settings) -> list[Row]:
    rows = [side_by_side(settings)]
    if not settings.quick:
        rows += smollm2(settings)
    return rows
