"""Attribution graphs: anatomy against circuit-tracer 0.5.0, on the same model, transcoders and prompt.

One row: SmolLM2-135M with 30 per-layer JumpReLU transcoders of 2,304 features (random, calibrated to fire 42
features per token and layer, circuit_sets.py, until trained ones exist), a 16-token prompt it gets right
(" Berlin", p 0.78; the README's example),
2 threads: the pruned graph a user asks for (every direct effect, pruning at 0.8 / 0.98, the two scores), in
seconds and peak resident memory, each side in a process of its own, one after the other. The two adjacencies
are compared node by node (features by layer, position and index; errors; tokens; logits): max |diff|.

A second row, anatomy's alone: why that pruned graph's attention attends, the QK_EDGES strongest edges across
positions split by head and their largest heads' scores split into pairs of nodes (explain_attention), in
seconds beyond the graph, in the same process (issue 36's goal: 10 s).

circuit-tracer runs from its own environment ($ANATOMY_CIRCUIT_TRACER_PYTHON, else the cached
~/.cache/anatomy/venv-circuit-tracer, made when absent by peers.py: circuit-tracer 0.5.0, nnsight 0.6.1,
transformer-lens 3.2.1, transformers 4.57.3 over this environment's torch), with its nnsight backend (it takes a local folder) at batch 128,
its fastest setting here (shared/notes/circuit-tracer-on-a-cpu.md). --quick: the tests' tiny Llama and set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..heap import GRAPH_THRESHOLD, return_large_buffers
from .common import Row, Settings, load_average
from .peers import peer_python

PROMPT = "The capital of the state containing Dallas is Austin. The capital of Germany is"  # the README's example
WORKER = Path(__file__).with_name("circuit_tracer_worker.py")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "circuits" / "fixtures" / "graphs"
QK_EDGES = 20  # the attention-mediated edges whose heads and scores are explained (issue 36's goal: within 10 s)


def prepare(settings: Settings, folder: Path) -> tuple[Path, Path, str]:
    """(a Hugging Face folder of the model, the transcoder set in circuit-tracer's format, the prompt)."""
    if settings.quick:
        prompt = json.loads((FIXTURES / "README.json").read_text())["prompt"]
        return FIXTURES / "llama", FIXTURES / "plt_jumprelu", prompt
    from ..checkpoints import from_pretrained
    from ..circuits.attribute import prompt_ids
    from ..sae import save_transcoders
    from .circuit_sets import calibrated_random_transcoders

    model = from_pretrained("smollm2").eval()
    ids = prompt_ids(model, PROMPT)  # 16 tokens: the BOS circuit-tracer puts in front, and 15 of the text
    prompt = PROMPT
    model_folder = folder / "smollm2"
    write_model(model, model_folder)
    transcoders = calibrated_random_transcoders(model, ids[None])
    save_transcoders(transcoders, folder / "transcoders", scan="anatomy-bench/random-calibrated")
    return model_folder, folder / "transcoders", prompt


def write_model(model, folder: Path) -> None:
    """The model as a Hugging Face folder that transformers 4.57 (circuit-tracer's) reads as anatomy does."""
    model.save_pretrained(folder, max_shard_size="1GB")  # a 2B model's shards written one at a time
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:  # transformers 4.57 reads a top-level rope_theta only
        config["rope_theta"] = theta
        config_path.write_text(json.dumps(config))


def run(command: list[str], out: Path, threads: int) -> dict:
    """The JSON a worker wrote to `out` (its command names it), or RuntimeError with its stderr's end."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=4 * 3600,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if done.returncode == 3 and out.is_file():  # stopped by its memory watchdog: the JSON says where
        return json.loads(out.read_text())
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[1]).name} failed: {done.stderr[-800:]}")
    return json.loads(out.read_text())


def anatomy_side(model_folder: str, transcoder_folder: str, out: str, options: str) -> None:
    """The worker anatomy's side runs in (python -m anatomy.bench.circuits ...): load, then time the pruned graph.
    options: prompt or prompt_ids, threads; batch_size, max_feature_nodes, dtype (of the model and the set),
    memory_goal_gb (--max-memory: the goal less what is loaded), compare (write the adjacency, default true), qk
    (explain the pruned graph's attention after the graph and its peak memory are measured, default true)."""
    from ..checkpoints import from_pretrained
    from ..circuits import attribution_graph, prune, pruned, scores
    from ..circuits.attention_edges import explain_attention
    from ..sae import load_transcoders
    from .circuit_tracer_worker import PHASE, status_gb, watch_memory
    from safetensors.torch import save_file

    settings = json.loads(options)
    torch.set_num_threads(settings["threads"])
    return_large_buffers(GRAPH_THRESHOLD)  # as `anatomy circuits` does
    watch_memory(Path(out))
    dtype = getattr(torch, settings.get("dtype", "float32"))
    model = from_pretrained(model_folder, dtype=dtype).eval()
    transcoders = load_transcoders(transcoder_folder, dtype=dtype)
    for layer in range(transcoders.n_layers):  # the set reads its layers when first used: read before the clock
        transcoders.layers[layer]
    loaded = status_gb("VmRSS")
    goal = settings.get("memory_goal_gb")
    max_bytes = None if goal is None else int((0.95 * goal - loaded) * 1e9)  # the goal less what is loaded
    prompt = torch.tensor(settings["prompt_ids"]) if "prompt_ids" in settings else settings["prompt"]
    PHASE["now"] = "attribution_graph"
    cpu = time.process_time()
    start = time.perf_counter()
    graph = attribution_graph(model, prompt, transcoders, max_feature_nodes=settings.get("max_feature_nodes"),
                              batch_size=settings.get("batch_size", 512), max_bytes=max_bytes,
                              attention_products=settings.get("attention_products", "float32"))
    attributed = time.perf_counter() - start
    PHASE["now"] = "pruning"
    decision = prune(graph, 0.8, 0.98)
    small = pruned(graph, decision=decision)
    replacement, completeness = scores(graph, decision.influence)
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    peak = status_gb("VmHWM")  # the graph's, pruned and scored: before the attention's work
    qk_seconds = qk_cpu = None
    if settings.get("qk", True):
        qk_cpu, qk_start = time.process_time(), time.perf_counter()
        explain_attention(model, transcoders, small, n=QK_EDGES)  # beyond the graph: why its attention attends
        qk_seconds, qk_cpu = time.perf_counter() - qk_start, time.process_time() - qk_cpu
    attention = small.meta.get("attention", {"edges": [], "qk": [], "check": ""})
    if settings.get("compare", True):
        save_file({"adjacency": graph.adjacency}, str(Path(out).with_suffix(".safetensors")),
                  metadata={"ids": json.dumps([node.id for node in graph.nodes])})
    Path(out).write_text(json.dumps({
        "attribute_seconds": attributed, "seconds": total, "cpu_seconds": cpu, "peak_gb": peak,
        "loaded_gb": loaded, "max_memory_gb": (max_bytes or 0) / 1e9, "memory": graph.meta["memory"],
        "file_gb": graph.meta["rows_on_file_bytes"] / 1e9,
        "scores": [replacement, completeness], "nodes": len(graph), "active": graph.meta["features_active"],
        "features": sum(node.kind == "feature" for node in graph.nodes), "check": graph.check, "error": graph.error,
        "kept_nodes": len(small), "kept_edges": int(torch.count_nonzero(small.adjacency)),
        "qk_seconds": qk_seconds, "qk_cpu_seconds": qk_cpu, "qk_edges": len(attention["edges"]),
        "qk_heads": len(attention["qk"]), "qk_check": attention["check"],
    }))


def compare(ours: Path, theirs: Path) -> tuple[float, int]:
    """(max |diff| between the two adjacencies on the nodes both have, how many of theirs ours lacks), nodes
    matched by what they are (circuit-tracer's order: features, errors layer by layer, tokens, logits). A
    capped graph of a long prompt may choose a few features otherwise where two rank within float rounding."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from ..circuits.graph import Node

    with safe_open(str(ours), "pt") as handle:
        ids = json.loads(handle.metadata()["ids"])
        adjacency = handle.get_tensor("adjacency")
    index = {node_id: i for i, node_id in enumerate(ids)}
    their = load_file(str(theirs))
    tokens, T = their["input_tokens"].tolist(), len(their["input_tokens"])
    n_layers = int(next(node_id for node_id in ids if node_id.startswith("logit:")).split(":")[1])
    order = [Node("feature", l, p, f).id for l, p, f in their["active_features"].tolist()]
    order += [Node("error", l, p).id for l in range(n_layers) for p in range(T)]
    order += [Node("token", -1, p, t).id for p, t in enumerate(tokens)]
    order += [Node("logit", n_layers, T - 1, t).id for t in their["logit_ids"].tolist()]
    both = torch.tensor([node_id in index for node_id in order])
    mapped = torch.tensor([index[node_id] for node_id in order if node_id in index])
    shared = both.nonzero().flatten()
    worst = 0.0
    for start in range(0, len(shared), 1024):
        rows = adjacency[mapped[start:start + 1024]][:, mapped]
        worst = max(worst, float((rows - their["adjacency"][shared[start:start + 1024]][:, shared]).abs().max()))
    return worst, int((~both).sum())


def bench_circuits(settings: Settings) -> list[Row]:
    threads = 1 if settings.quick else 2
    python, how = peer_python("circuit-tracer", install=not settings.quick)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        model_folder, transcoder_folder, prompt = prepare(settings, folder)
        options = json.dumps({"prompt": prompt, "threads": threads, "batch_size": 8 if settings.quick else 128})
        ours = run([sys.executable, "-m", "anatomy.bench.circuits", str(model_folder), str(transcoder_folder),
                    str(folder / "anatomy.json"), options], folder / "anatomy.json", threads)
        theirs = None
        if python:
            theirs = run([python, str(WORKER), str(model_folder), str(transcoder_folder), str(folder / "circuit-tracer.json"),
                          options], folder / "circuit-tracer.json", threads)
            difference, _ = compare(folder / "anatomy.safetensors", folder / "circuit-tracer.safetensors")
    model = "tiny Llama (the tests')" if settings.quick else "SmolLM2-135M"
    case = f"pruned attribution graph, {model}, {ours['features']:,} features, {threads} threads"
    row = Row("circuits", case, "s", ours["seconds"], theirs["seconds"] if theirs else None, False)
    row.notes = [how, f"anatomy: graph {ours['attribute_seconds']:.1f} s, pruned and scored {ours['seconds']:.1f} s "
                      f"({ours['cpu_seconds']:.0f} s of CPU), peak {ours['peak_gb']:.2f} GB; replacement {ours['scores'][0]:.3f}, completeness "
                      f"{ours['scores'][1]:.3f}; {ours['check']}"]
    if theirs:
        row.notes.append(f"circuit-tracer {theirs['version']} (nnsight, batch {json.loads(options)['batch_size']}): "
                         f"attribute {theirs['attribute_seconds']:.1f} s, prune_graph {theirs['prune_seconds']:.1f} s "
                         f"({theirs['cpu_seconds']:.0f} s of CPU), peak {theirs['peak_gb']:.2f} GB; replacement {theirs['scores'][0]:.3f}, completeness "
                         f"{theirs['scores'][1]:.3f}")
        row.notes.append(f"same adjacency: max |diff| {difference:.2g} over {theirs['features']:,} features; pruned "
                         f"{ours['kept_nodes']} vs {theirs['kept_nodes']} nodes")
    row.notes.append(f"one process a side, one after the other; load {load_average()}")
    qk = Row("circuits", f"why attention attends: the {ours['qk_edges']} strongest attention-mediated edges of that "
                         f"pruned graph split by head, QK for their largest heads, {model}, {threads} threads, beyond "
                         f"the graph", "s", ours["qk_seconds"], None, False)
    qk.notes = [f"goal 10 s; {ours['qk_heads']} heads' scores split into pairs of nodes ({ours['qk_cpu_seconds']:.1f} s "
                f"of CPU); {ours['qk_check']}; no peer computes it (circuit-tracer's head loadings are an open pull "
                f"request, #114, and it has no QK attribution)"]
    return [row, qk]


if __name__ == "__main__":
    anatomy_side(*sys.argv[1:5])
