"""Exact circuit discovery: ACDC side by side with auto-circuit, and the SmolLM2 IOI goals of exact patching.

Rows:

- **ACDC, every edge, side by side with auto-circuit 1.0.1** on a random GPT-2-shaped model both open (its
  weights tripled, as the parity fixtures are, so that the corruption moves the next token: 6 layers x 384,
  32 pairs of 16 tokens, KL at tau = 1e-3): seconds of each, the edges each keeps and whether they are the
  same, auto-circuit's edges put in anatomy's order (autocircuit_worker.acdc_kept). In its own environment
  (peers.peer_python); without one the row says why.
- **SmolLM2-135M, IOI, 100 pairs** (not in --quick): 200 edges outside EAP-IG's top 50 path-patched from
  their layers (goal 4 minutes), with the largest exact effect found outside and the recall of the exact
  top 50; the faithfulness curve (its seconds, the stage `circuits discover` spends most in); ACDC over
  every edge, estimated from the measured seconds of one circuit run from layers 0, 10, 20 and 29 (each of
  its 70,651 tests is such a run of the 100 pairs: the goal, 15 minutes, is out of reach on a CPU). CPU
  seconds beside wall seconds: on a shared machine the wall time is an upper bound.
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
from .discovery import WORKER, _pairs
from .peers import peer_python

ACDC_TAU = (1, -3)  # auto-circuit's tao_bases and tao_exps: tau = 1e-3


def timed(fn):
    """(the value, wall seconds, CPU seconds of this process) of fn()."""
    cpu, wall = time.process_time(), time.perf_counter()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def acdc_side_by_side(settings: Settings) -> Row:
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from ..checkpoints import from_pretrained
    from ..circuits.discovery import Task
    from ..circuits.discovery.acdc import acdc

    layers, width, heads, n, length = (2, 32, 4, 4, 8) if settings.quick else (6, 384, 6, 32, 16)
    threshold = ACDC_TAU[0] * 10.0 ** ACDC_TAU[1]
    python, how = peer_python("auto-circuit", install=not settings.quick)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=1000, n_positions=64)
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory) / "gpt2"
        hf = GPT2LMHeadModel(config).eval()
        with torch.no_grad():
            for parameter in hf.parameters():
                parameter.mul_(3.0)
        hf.save_pretrained(folder, safe_serialization=True)
        pairs = _pairs(1000, n, length)
        save_file(pairs, str(Path(directory) / "pairs.safetensors"))
        model = from_pretrained(folder).eval()
        task = Task("bench", pairs["clean"], pairs["corrupt"], torch.full((n,), length), pairs["answers"], pairs["wrongs"])
        result, ours, cpu = timed(lambda: acdc(model, task, threshold=threshold))
        graph = result.extra["graph"]
        kept = sorted(graph.edge_name(u, v) for u, v in result.extra["kept"].nonzero().tolist())
        case = f"ACDC (KL, τ = {threshold:g}), every edge, GPT-2 {layers} x {width} (weights x3), {n} x {length}"
        notes = [how, f"{len(kept)} of {graph.edge_count:,} edges kept, {result.extra['runs']:,} circuits run, "
                      f"{cpu:.1f} s of CPU", _at_equal_size(model, task, result)]
        theirs = None
        if python is not None:
            out = Path(directory) / "theirs.json"
            completed = subprocess.run([python, str(WORKER), str(folder), str(Path(directory) / "pairs.safetensors"), "1",
                                        str(out), *map(str, ACDC_TAU)], capture_output=True, text=True, timeout=7200,
                                       env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
            if completed.returncode:
                notes.append(f"auto-circuit failed: {completed.stderr.strip()[-200:]}")
            else:
                reply = json.loads(out.read_text(encoding="utf-8"))["acdc"]
                theirs = None if settings.quick else reply["seconds"]  # no speed-up in a smoke test
                same = "the same edges" if reply["kept"] == kept else \
                    f"edges differ: {len(set(reply['kept']) ^ set(kept))} kept by one only"
                notes.append(f"auto-circuit keeps {len(reply['kept'])}: {same}")
    return Row("discovery", case, "s", ours, theirs, False, notes)


def _at_equal_size(model, task, result) -> str:
    """ACDC's circuit beside EAP-IG's top edges of the same count: the faithfulness of each (corrupt ablation)."""
    from ..circuits.discovery import attribute_edges
    from ..circuits.discovery.faithfulness import circuit_faithfulness, kept_masks

    graph, kept = result.extra["graph"], result.extra["kept"]
    size = int(kept.sum())
    if size == 0:
        return "ACDC keeps no edge: nothing to compare"
    scores = attribute_edges(model, task, method="eap-ig", steps=5)
    faithful = circuit_faithfulness(model, task, graph, torch.stack([kept, kept_masks(graph, scores, [size])[0]]))
    return f"faithfulness at {size} edges: ACDC's {faithful[0]:.3f}, EAP-IG's top {size} {faithful[1]:.3f}"


def smollm2_exact(settings: Settings) -> list[Row]:
    from ..checkpoints import from_pretrained
    from ..circuits.discovery import attribute_edges, faithfulness, ioi, verify_edges

    model = from_pretrained("smollm2").eval()
    task = ioi(model, 100)
    edges = attribute_edges(model, task, method="eap-ig", steps=5)
    rows = []
    checked, wall, cpu = timed(lambda: verify_edges(model, task, edges, 50, sample=200))
    top, _, top_cpu = timed(lambda: verify_edges(model, task, edges, 50))
    rows.append(Row("discovery", "SmolLM2 IOI, exact path patching of 200 edges outside EAP-IG's top 50 (and the 50)",
                    "s", wall, None, False,
                    [f"goal 240 s; {cpu:.0f} s of CPU, of which the top 50 alone {top_cpu:.0f}; "
                     f"largest exact effect outside {checked.extra['outside']['edge']} "
                     f"{checked.extra['outside']['exact']:.3g} (rank {checked.extra['outside']['rank']:,}); recall of "
                     f"the exact top 50 {checked.extra['recall']:.2f}; load {load_average()}"]))
    curve, wall, cpu = timed(lambda: faithfulness(model, task, edges))
    rows.append(Row("discovery", f"SmolLM2 IOI, the faithfulness curve ({len(curve.extra['sizes'])} circuits)", "s",
                    wall, None, False, [f"{cpu:.0f} s of CPU; smallest circuit past 80%: {curve.extra['smallest']} edges; "
                                        f"load {load_average()}"]))
    rows.append(_acdc_estimate(model, task))
    return rows


def _acdc_estimate(model, task) -> Row:
    """ACDC over every edge, from the CPU seconds of one circuit run from a few layers: each test of an edge
    is one run of the task's pairs from the edge's destination layer (acdc._distances)."""
    from ..circuits.discovery.acdc import _Chunk, _distances, acdc_order
    from ..circuits.discovery.paths import plan_passes
    from ..circuits.discovery.residual import ResidualGraph

    graph = ResidualGraph(model)
    pairs_per_chunk, copies = plan_passes(graph, task, len(graph.sources), 4096, 2**29)
    chunks = [_Chunk(model, graph, task, rows) for rows in task.batches(pairs_per_chunk)]
    layers = sorted({0, graph.n_layers // 3, 2 * graph.n_layers // 3, graph.n_layers - 1})
    costs = {}
    for layer in layers:
        circuit = torch.zeros(1, *graph.allowed.shape, dtype=torch.bool)
        circuit[0, :, graph.layer_destinations(layer)[0]] = graph.allowed[:, graph.layer_destinations(layer)[0]]
        _, _, costs[layer] = timed(lambda: _distances(model, graph, task, chunks, circuit, layer, "kl", copies))
    per_layer = torch.tensor([costs[l] for l in layers])
    estimate = 0.0
    for _, v in acdc_order(graph):
        layer = min(graph.destinations[v].layer, graph.n_layers - 1)
        estimate += float(torch.from_numpy(__import__("numpy").interp([layer], layers, per_layer.numpy()))[0])
    notes = [f"estimated from one circuit's CPU seconds from layers {', '.join(f'{l}: {costs[l]:.1f}' for l in layers)} "
             f"over {len(task)} pairs, times the {graph.edge_count:,} tests (speculation only adds runs); goal 900 s: "
             f"out of reach on a CPU, not run"]
    return Row("discovery", f"SmolLM2 IOI, ACDC over every edge ({graph.edge_count:,}), estimated", "s", estimate, None,
               False, notes)


def bench_discovery_exact(settings: Settings) -> list[Row]:
    rows = [acdc_side_by_side(settings)]
    if not settings.quick:
        rows += smollm2_exact(settings)
    return rows
