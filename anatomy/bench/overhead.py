"""Per-pass overhead: what a forward pass costs when its arithmetic costs nothing.

A small input (one 16-token sentence, one decoded token) is dominated by Python and the torch
dispatcher, not by the kernels. This group makes the models of the suite 16 to 32 times narrower
(d_model 24 or 48, same layers and heads), so that what remains is overhead, and reports per pass:
module calls, trace points reached, top-level aten ops (each one a dispatch, and on 2 threads
possibly an OpenMP fork/join), and the time of a pass, for anatomy and for transformers.

    anatomy bench --only overhead            # 2000 passes each, interleaved
    anatomy bench --only overhead --quick    # 20 passes: checks that it runs

Times are the 5th percentile of interleaved single passes: on a shared machine the noise only
ever adds, so a low percentile estimates the uncontended cost.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import torch
from torch import nn

from ..trace import trace_points
from .common import Row, Settings, gpt2_pair, pair


def count_module_calls(fn) -> int:
    calls = 0

    def hook(module, args):
        nonlocal calls
        calls += 1

    handle = nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        fn()
    finally:
        handle.remove()
    return calls


def count_trace_points(model, fn) -> int:
    reached = 0

    def count(x):
        nonlocal reached
        reached += 1
        return x

    points = trace_points(model).values()
    for point in points:
        point.fn = count
    try:
        fn()
    finally:
        for point in points:
            point.fn = None
    return reached


def count_aten_ops(fn) -> Counter:
    with torch.profiler.profile() as prof:
        fn()
    return Counter(e.name for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))


def low_percentile_us(fns: dict, passes: int) -> dict[str, float]:
    times = {name: [] for name in fns}
    for i in range(passes):
        for name in (list(fns) if i % 2 == 0 else reversed(list(fns))):
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e6)
    return {name: (statistics.quantiles(t, n=20)[0] if len(t) >= 20 else min(t)) for name, t in times.items()}


def decode_step(model, hf: bool):
    """One cached decoding step after a 16-token prompt, for either library."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    token = prompt[:, :1]
    if hf:
        from transformers import DynamicCache

        def step():
            cache = DynamicCache(config=model.config)
            model(prompt, past_key_values=cache, use_cache=True)
            return lambda: model(token, past_key_values=cache, use_cache=True)

        # Re-running on one DynamicCache grows it; a fresh prefill per pass would dominate, so
        # the cache is refilled every 64 steps (its length changes the step's cost very little).
        state = {"n": 0, "run": step()}

        def run():
            state["n"] += 1
            if state["n"] % 64 == 0:
                state["run"] = step()
            state["run"]()

        return run
    cache = model.new_cache(64)
    model(prompt, cache=cache)

    def run():
        cache.length = 16  # overwrite the same slot: every pass is the same 17th position
        model(token, cache=cache)

    return run


def bench_overhead(settings: Settings) -> list[Row]:
    """Per-pass time (5th percentile, us), aten ops, module calls and trace points, both libraries."""
    from transformers import BertConfig, BertModel  # optional extra: bench

    passes = 20 if settings.quick else (settings.repeats or 2000)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # overhead is single-threaded Python; one thread keeps kernels out of it
    try:
        torch.manual_seed(0)
        enc_ours, enc_theirs = pair(BertModel(BertConfig(
            vocab_size=99, hidden_size=24, num_hidden_layers=6, num_attention_heads=12, intermediate_size=48,
            max_position_embeddings=64, attn_implementation="sdpa")))
        dec_ours, dec_theirs = gpt2_pair(12, 48, 12, vocab_size=99, max_seq_len=128)
        ids = torch.randint(1, 99, (1, 16), generator=torch.Generator().manual_seed(0))
        rows = []
        with torch.inference_mode():
            cases = {
                "encoder 1x16 pass (6 layers)": (6, enc_ours, lambda: enc_ours(ids), lambda: enc_theirs(ids)),
                "decoder step (12 layers)": (12, dec_ours, decode_step(dec_ours, False), decode_step(dec_theirs, True)),
            }
            for name, (layers, model, ours, theirs) in cases.items():
                ours(), theirs()
                us = low_percentile_us({"anatomy": ours, "transformers": theirs}, passes)
                ops = {side: sum(count_aten_ops(fn).values()) for side, fn in (("anatomy", ours), ("transformers", theirs))}
                calls = {side: count_module_calls(fn) for side, fn in (("anatomy", ours), ("transformers", theirs))}
                row = Row("overhead", name, "us", us["anatomy"], us["transformers"], False)
                row.notes = [
                    f"aten ops {ops['anatomy']} vs {ops['transformers']} ({ops['anatomy'] / layers:.0f} vs "
                    f"{ops['transformers'] / layers:.0f} per layer)",
                    f"module calls {calls['anatomy']} vs {calls['transformers']}",
                    f"trace points reached {count_trace_points(model, ours)}",
                ]
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return rows
