"""circuit-tracer's side of `anatomy bench --only circuits`, run in circuit-tracer's own environment (no anatomy).

    python circuit_tracer_worker.py MODEL_FOLDER TRANSCODER_FOLDER OUT.json OPTIONS_JSON

Loads the Hugging Face folder with circuit-tracer 0.5's nnsight backend (which takes a folder as it is) and the
transcoder set from its config.yaml, then times what a user runs for a pruned graph: `attribute` (its best
setting on this machine: batch 128; every feature, or max_feature_nodes) and `prune_graph`, and
`compute_graph_scores`. Writes the seconds, the peak resident memory (VmHWM), the scores, and the adjacency with
its node list (OUT.safetensors, unless options say compare: false). OPTIONS: prompt or prompt_ids, threads,
batch_size, max_feature_nodes, dtype (float32, bfloat16), time_limit_s. A watchdog stops the process when its
resident memory passes what the machine had free at its start (less 1 GB), or `attribute` has run time_limit_s
seconds (`watch_time`): OUT.json then says {"stopped": where and at what}, with the feature rows computed by then
and the rate they came at.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file


def status_gb(field: str = "VmHWM") -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1e6
    return float("nan")


def peak_gb() -> float:
    return status_gb("VmHWM")


PHASE = {"now": "loading"}  # what the process is doing, for the watchdog's message
PROGRESS = {"rows": 0, "started": None}  # attribute's feature rows computed, and when it started (perf_counter)
GRACE_S = 60  # a phase that makes no rows is stopped this long past the time limit


def stop_at_time(out: Path, limit_s: float, rows_asked: int | None) -> None:
    """Write {"stopped": ...}, with the rows made and the rate they came at, to `out` and end the process."""
    rows, spent = PROGRESS["rows"], time.perf_counter() - PROGRESS["started"]
    pace = (f"; at that rate the {rows_asked:,} would take {rows_asked / rows * spent / 3600:.1f} h"
            if rows and rows_asked else "")
    out.write_text(json.dumps({"stopped": f"past its time limit of {limit_s:g} s while {PHASE['now']}: {rows:,} feature "
                                          f"rows computed in {spent:.0f} s{pace} (peak {peak_gb():.1f} GB so far)"}))
    os._exit(3)


def watch_time(out: Path, limit_s: float, rows_asked: int | None) -> None:
    """Stop the process once `attribute` has run limit_s: checked after each batch of feature rows (counted where
    its progress bar counts them, which it updates even when hidden), and by a thread GRACE_S past the limit for
    a phase that makes none."""
    import circuit_tracer.attribution.attribute as traced

    def late() -> bool:
        return PROGRESS["started"] is not None and time.perf_counter() - PROGRESS["started"] >= limit_s

    class Counted(traced.tqdm):
        def update(self, n=1):
            PROGRESS["rows"] += n
            if late():
                stop_at_time(out, limit_s, rows_asked)
            return super().update(n)

    def watch() -> None:
        while PROGRESS["started"] is None or time.perf_counter() - PROGRESS["started"] < limit_s + GRACE_S:
            time.sleep(0.5)
        stop_at_time(out, limit_s, rows_asked)

    traced.tqdm = Counted
    threading.Thread(target=watch, daemon=True).start()


def watch_memory(out: Path, limit_gb: float | None = None) -> float:
    """Start a thread that writes {"stopped": ...} to `out` and ends the process when its resident memory passes
    limit_gb (default: the machine's MemAvailable now, less 1 GB); returns the limit."""
    if limit_gb is None:
        available = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemAvailable"))
        limit_gb = available / 1e6 - 1.0 + status_gb("VmRSS")

    def watch() -> None:
        while True:
            rss = status_gb("VmRSS")
            if rss > limit_gb:
                out.write_text(json.dumps({"stopped": f"past {limit_gb:.1f} GB of resident memory ({rss:.1f} GB, what "
                                                      f"the machine had free) while {PHASE['now']}"}))
                os._exit(3)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return limit_gb


def main() -> None:
    model_folder, transcoder_folder, out, options = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
    torch.set_num_threads(options["threads"])
    watch_memory(out)
    dtype = getattr(torch, options.get("dtype", "float32"))
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.hf_utils import load_transcoders

    if options.get("time_limit_s") is not None:
        watch_time(out, options["time_limit_s"], options.get("max_feature_nodes"))

    config = yaml.safe_load((transcoder_folder / "config.yaml").read_text())
    config.setdefault("scan", "anatomy-bench")
    if config["model_kind"] == "transcoder_set":
        config["transcoders"] = [str(transcoder_folder / f"layer_{i}.safetensors")
                                 for i in range(len(list(transcoder_folder.glob("layer_*.safetensors"))))]
    loaded = time.perf_counter()
    transcoders = load_transcoders(config, device=torch.device("cpu"), dtype=dtype, lazy_decoder=False)
    model = ReplacementModel.from_pretrained_and_transcoders(model_folder, transcoders, backend="nnsight",
                                                             device=torch.device("cpu"), dtype=dtype)
    loaded = time.perf_counter() - loaded
    prompt = torch.tensor(options["prompt_ids"]) if "prompt_ids" in options else options["prompt"]
    PHASE["now"] = f"attribute (max_feature_nodes {options.get('max_feature_nodes')}, batch {options['batch_size']})"
    cpu = time.process_time()
    start = PROGRESS["started"] = time.perf_counter()
    try:
        graph = attribute(prompt, model, batch_size=options["batch_size"], max_feature_nodes=options.get("max_feature_nodes"))
    except (MemoryError, RuntimeError) as error:  # an allocation the machine refused
        out.write_text(json.dumps({"stopped": f"{type(error).__name__} while {PHASE['now']}: {str(error)[:200]}"}))
        sys.exit(3)
    attributed = time.perf_counter() - start
    PHASE["now"] = "prune_graph"
    node_mask, edge_mask, _ = prune_graph(graph, 0.8, 0.98)
    pruned = time.perf_counter() - start - attributed
    replacement, completeness = compute_graph_scores(graph)
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    if options.get("compare", True):
        save_file({"adjacency": graph.adjacency_matrix.float().contiguous(),
                   "active_features": graph.active_features[graph.selected_features].long().contiguous(),
                   "input_tokens": graph.input_tokens.long().contiguous(),
                   "logit_ids": graph.logit_token_ids.long().contiguous()}, str(out.with_suffix(".safetensors")))
    import circuit_tracer
    out.write_text(json.dumps({
        "version": getattr(circuit_tracer, "__version__", "0.5.0"), "load_seconds": loaded,
        "attribute_seconds": attributed, "prune_seconds": pruned, "seconds": total, "cpu_seconds": cpu, "peak_gb": peak_gb(),
        "scores": [replacement, completeness], "features": len(graph.selected_features), "batch_size": options["batch_size"],
        "kept_nodes": int(node_mask.sum()), "kept_edges": int(edge_mask.sum()),
    }))


if __name__ == "__main__":
    main()
