"""SmolLM2-135M's IOI circuit: EAP-IG over 100 pairs, its faithfulness curve, its top edges path-patched
exactly with a sample of the edges outside them, AtP* on heads against exact patching, and the circuit's
heads named by role.

    python recipes/ioi_smollm2.py --threads 2 --out docs/discovery-smollm2-ioi     # .png, .html, .json

Each stage's wall time, its CPU time and the load average are printed beside it (the CPU is shared: the
CPU time is what a stage costs; rerun on an idle machine for wall times to report).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import anatomy
from anatomy.circuits import save
from anatomy.circuits.discovery import (attribute_edges, attribute_nodes, faithfulness, ioi, kept_masks, verify_edges,
                                        verify_nodes)
from anatomy.circuits.discovery import circuit_for_page
from anatomy.circuits.discovery.figures import head_weights, plot_discovery
from anatomy.circuits.discovery.roles import head_roles


def stage(log: dict, name: str, started: tuple[float, float]) -> tuple[float, float]:
    now = time.perf_counter(), time.process_time()
    wall, cpu = now[0] - started[0], now[1] - started[1]
    log[name] = {"seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "load": os.getloadavg()[0]}
    print(f"{name}: {wall:.1f} s ({cpu:.1f} s of CPU, load {os.getloadavg()[0]:.1f})", flush=True)
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--out", default="docs/discovery-smollm2-ioi")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    log: dict = {"threads": args.threads}
    t = time.perf_counter(), time.process_time()
    model = anatomy.from_pretrained("smollm2").eval()
    task = ioi(model, args.pairs)
    t = stage(log, "task", t)
    edges = attribute_edges(model, task, method="eap-ig", steps=5)
    t = stage(log, "eap-ig", t)
    curve = faithfulness(model, task, edges)
    t = stage(log, "faithfulness", t)
    checked = verify_edges(model, task, edges, 50, sample=200)
    t = stage(log, "verify 50 edges and 200 outside", t)
    star = attribute_nodes(model, task, kind="heads", method="atp*")
    t = stage(log, "atp* heads", t)
    exact = verify_nodes(model, task, star, 20)
    t = stage(log, "verify 20 heads", t)
    graph = edges.extra["graph"]
    size = curve.extra["smallest"] or graph.edge_count
    kept = kept_masks(graph, edges, [size])[0]
    weights = head_weights(graph, edges.values, kept)
    top = sorted(weights, key=weights.get, reverse=True)[:15]
    roles = head_roles(model, task, top)
    t = stage(log, "roles", t)
    heads = [(f"L{l}H{h}", weights[(l, h)], ", ".join(roles["roles"][(l, h)])) for l, h in top]
    title = (f"SmolLM2-135M, IOI: {len(task)} pairs, EAP-IG (5 steps) over {graph.edge_count:,} edges; "
             f"the top {size} recover {curve.values[curve.extra['sizes'].index(size)]:.2f} of the gap")
    plot_discovery(curve, heads, title, f"{args.out}.png")
    save(circuit_for_page(model, task, edges, curve, size=size, about=title), f"{args.out}.html")
    summary = {
        "pairs": len(task), "dropped": task.dropped, "edges": graph.edge_count, "check": edges.check,
        "clean": curve.extra["clean"], "corrupt": curve.extra["ablated"], "sizes": curve.extra["sizes"],
        "faithfulness": [round(v, 4) for v in curve.values.tolist()], "smallest": curve.extra["smallest"],
        "verify_edges": {"spearman": checked.extra["spearman"], "check": checked.check,
                         "outside": checked.extra["outside"], "recall": checked.extra["recall"]},
        "atp_star_heads": {"spearman": exact.extra["spearman"], "check": exact.check},
        "heads": [{"head": name, "weight": round(weight, 4), "roles": r,
                   "name_mover_attention": round(float(roles["attention"][int(name[1:].split("H")[0]), int(name.split("H")[1])]), 3),
                   "direct": round(float(roles["direct"][int(name[1:].split("H")[0]), int(name.split("H")[1])]), 4)}
                  for name, weight, r in heads],
        "stages": log,
    }
    with open(f"{args.out}.json", "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, ensure_ascii=False)
    print(json.dumps({k: v for k, v in summary.items() if k != "stages"}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
