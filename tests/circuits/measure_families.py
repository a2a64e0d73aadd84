"""The numbers of the families table (README "Architectures", docs/circuits.md "Families"): for each case of
test_families.py, the graph's identity and its worst edge against the frozen model; for each circuit-tracer set
of test_circuit_tracer_families.py, the worst adjacency difference. Not a test: the tests assert the bounds,
this prints what they measure.

    PYTHONPATH=. python tests/circuits/measure_families.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))

from frozen_reference import frozen_reference  # noqa: E402
from test_circuit_tracer_families import FIXTURES, SETS as CT_SETS, graph_of as ct_graph_of, their_convention  # noqa: E402
from test_circuit_tracer_parity import aligned  # noqa: E402
from test_families import SETS, graph_of  # noqa: E402


def main() -> None:
    print(f"{'case':<24}{'nodes':>6}{'features':>9}{'identity':>10}{'worst edge':>12}{'largest':>9}")
    for case in SETS:
        model, transcoders, graph = graph_of(case)
        reference = frozen_reference(model, transcoders, graph)
        worst = float((graph.adjacency.double() - reference).abs().max())
        features = sum(node.kind == "feature" for node in graph.nodes)
        print(f"{case:<24}{len(graph):>6}{features:>9}{graph.error:>10.1e}{worst:>12.1e}{float(reference.abs().max()):>9.2f}")
    print(f"\n{'circuit-tracer set':<24}{'worst adjacency (its token convention)':>40}")
    for name in CT_SETS:
        _, _, graph = ct_graph_of(name)
        expected = load_file(str(FIXTURES / f"{name}.graph.safetensors"))
        order = aligned(graph, expected)
        ours = their_convention(graph, name).adjacency[order][:, order]
        print(f"{name:<24}{float((ours - expected['adjacency']).abs().max()):>40.1e}")


if __name__ == "__main__":
    with torch.no_grad():
        main()
