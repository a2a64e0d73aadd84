"""circuit-tracer's side of `anatomy bench --only circuits`, run in circuit-tracer's own environment (no anatomy).

    python circuit_tracer_worker.py MODEL_FOLDER TRANSCODER_FOLDER OUT.json OPTIONS_JSON

Loads the Hugging Face folder with circuit-tracer 0.5's nnsight backend (which takes a folder as it is) and the
transcoder set from its config.yaml, then times what a user runs for a pruned graph: `attribute` (its best
setting on this machine: batch 128, every feature) and `prune_graph`, and `compute_graph_scores`. Writes the
seconds, the peak resident memory (VmHWM), the scores, and the adjacency with its node list (OUT.safetensors).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file


def peak_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def main() -> None:
    model_folder, transcoder_folder, out, options = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
    torch.set_num_threads(options["threads"])
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.hf_utils import load_transcoders

    config = yaml.safe_load((transcoder_folder / "config.yaml").read_text())
    config.setdefault("scan", "anatomy-bench")
    if config["model_kind"] == "transcoder_set":
        config["transcoders"] = [str(transcoder_folder / f"layer_{i}.safetensors")
                                 for i in range(len(list(transcoder_folder.glob("layer_*.safetensors"))))]
    loaded = time.perf_counter()
    transcoders = load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
    model = ReplacementModel.from_pretrained_and_transcoders(model_folder, transcoders, backend="nnsight",
                                                             device=torch.device("cpu"), dtype=torch.float32)
    loaded = time.perf_counter() - loaded
    cpu = time.process_time()
    start = time.perf_counter()
    graph = attribute(options["prompt"], model, batch_size=options["batch_size"])
    attributed = time.perf_counter() - start
    node_mask, edge_mask, _ = prune_graph(graph, 0.8, 0.98)
    pruned = time.perf_counter() - start - attributed
    replacement, completeness = compute_graph_scores(graph)
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    save_file({"adjacency": graph.adjacency_matrix.float().contiguous(),
               "active_features": graph.active_features.long().contiguous(),
               "input_tokens": graph.input_tokens.long().contiguous(),
               "logit_ids": graph.logit_token_ids.long().contiguous()}, str(out.with_suffix(".safetensors")))
    import circuit_tracer
    out.write_text(json.dumps({
        "version": getattr(circuit_tracer, "__version__", "0.5.0"), "load_seconds": loaded,
        "attribute_seconds": attributed, "prune_seconds": pruned, "seconds": total, "cpu_seconds": cpu, "peak_gb": peak_gb(),
        "scores": [replacement, completeness], "features": len(graph.active_features),
        "kept_nodes": int(node_mask.sum()), "kept_edges": int(edge_mask.sum()),
    }))


if __name__ == "__main__":
    main()
