"""Decoding reads every weight once per token: how fast can this machine read them, by layout?

At batch 1 each projection is a matrix-vector product. anatomy stores weights as nn.Linear does,
[out, in], and computes x W^T; GPT-2's checkpoints (and transformers' Conv1D) store [in, out] and
compute x W. Same bytes, same flops, different kernels: this group times both on the matrices of
one GPT-2 124M token (12 layers and the tied LM head, 496 MB, far beyond the caches) and reports
the bandwidth each reaches: anatomy's column is [out, in] (x W^T), the transformers column is
[in, out] (x W, Conv1D's layout).

    anatomy bench --only gemv            # 12 sweeps per layout, interleaved
    anatomy bench --only gemv --quick    # 2 sweeps of a 1-layer, narrower set: checks that it runs
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .common import Row, Settings


def bench_gemv(settings: Settings) -> list[Row]:
    """GB/s of one token's matrix-vector products, best sweep, for each weight layout."""
    E, V, layers, sweeps = (768, 50257, 12, 12) if not settings.quick else (64, 1000, 1, 2)
    groups = {  # name -> [out, in] shapes; the LM head is the tied embedding [V, E]
        "W_QKV [3E, E]": [(3 * E, E)] * layers,
        "W_O [E, E]": [(E, E)] * layers,
        "FFN in [4E, E]": [(4 * E, E)] * layers,
        "FFN out [E, 4E]": [(E, 4 * E)] * layers,
        "LM head [V, E]": [(V, E)],
    }
    rows = []
    with torch.inference_mode():
        for name, shapes in groups.items():
            weights = [torch.randn(shape) for shape in shapes]
            transposed = [w.t().contiguous() for w in weights]
            x = torch.randn(1, shapes[0][1])
            nbytes = sum(w.numel() * 4 for w in weights)
            best = {"out_in": float("inf"), "in_out": float("inf")}
            for sweep in range(settings.repeats or sweeps):
                for layout in (("out_in", "in_out") if sweep % 2 == 0 else ("in_out", "out_in")):
                    start = time.perf_counter()
                    if layout == "out_in":
                        for w in weights:
                            F.linear(x, w)
                    else:
                        for w in transposed:
                            torch.mm(x, w)
                    best[layout] = min(best[layout], time.perf_counter() - start)
            row = Row("gemv", f"{name} x{len(shapes)}", "GB/s", nbytes / best["out_in"] / 1e9,
                      nbytes / best["in_out"] / 1e9, True)
            row.notes = [f"{nbytes / 1e6:.0f} MB; transformers column: the [in, out] layout (x W)"]
            rows.append(row)
    return rows
