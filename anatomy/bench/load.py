"""Loading a checkpoint: peak resident memory over the weights' bytes, and load time, against transformers.

One Llama safetensors folder, saved by transformers in a temporary folder (270M parameters, float32;
quick mode: a tiny one), is loaded by each library in a fresh Python process: load, then one forward
pass of 16 tokens. Each process reports

    peak / weights = (VmHWM at the end - VmRSS before loading) / the weights' bytes on disk

(VmHWM is reset to the current RSS just before loading, through /proc/self/clear_refs), and the
seconds from_pretrained took: the first call (what a script pays, the library's lazy imports
included) and a second one in the same process. Runs alternate between the libraries; the medians
are reported.
A memory-mapped weight counts once in the RSS, as the file's pages; a copy counts twice.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .common import Row, Settings, load_average

# hidden 1024, 16 layers, SwiGLU 2816, vocabulary 32,000, untied head: 271M parameters
FULL = dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
            intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=1000, max_position_embeddings=128, tie_word_embeddings=False)

# Run in a fresh interpreter: argv = library, folder. Prints one JSON line.
MEASURE = r"""
import json, sys, time
import torch
library, folder = sys.argv[1], sys.argv[2]
if library == "anatomy":
    import anatomy
    load = lambda: anatomy.from_pretrained(folder, tokenizer=False)
else:
    import transformers
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(folder)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # VmHWM := VmRSS
before = status("VmRSS")
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
with torch.no_grad():
    model(torch.randint(0, 100, (1, 16)))
peak = status("VmHWM") - before
del model
start = time.perf_counter()
model = load()  # again, in the same process: the library's code is imported and the file is in the page cache
warm = time.perf_counter() - start
with torch.no_grad():
    model(torch.randint(0, 100, (1, 16)))  # the first pass faults in whatever pages the load did not read
warm_forward = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "warm_seconds": warm, "warm_forward_seconds": warm_forward, "peak_bytes": peak}))
"""


def _make_folder(directory: Path, sizes: dict) -> int:
    """A random Llama saved by transformers (float32 safetensors); returns the weights' bytes on disk."""
    import transformers  # optional extra: bench

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**sizes)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def _measure(library: str, folder: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", MEASURE, library, str(folder)], capture_output=True, text=True,
                            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    if result.returncode != 0:
        raise RuntimeError(f"the {library} load process failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def bench_load(settings: Settings) -> list[Row]:
    sizes = TINY if settings.quick else FULL
    runs = 1 if settings.quick else max(1, min(settings.repeats, 3))
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        weight_bytes = _make_folder(folder, sizes)
        results: dict[str, list[dict]] = {"anatomy": [], "transformers": []}
        for round_index in range(runs):
            order = ("anatomy", "transformers") if round_index % 2 == 0 else ("transformers", "anatomy")
            for library in order:
                results[library].append(_measure(library, folder))
    ratio = {lib: statistics.median(r["peak_bytes"] for r in rs) / weight_bytes for lib, rs in results.items()}
    seconds = {lib: statistics.median(r["seconds"] for r in rs) for lib, rs in results.items()}
    warm = {lib: statistics.median(r["warm_seconds"] for r in rs) for lib, rs in results.items()}
    ready = {lib: statistics.median(r["warm_forward_seconds"] for r in rs) for lib, rs in results.items()}
    n_params = weight_bytes / 4
    case = f"Llama {n_params / 1e6:.3g}M float32 safetensors ({weight_bytes / 2**20:.0f} MiB)"
    notes = [f"{runs} fresh process{'es' if runs > 1 else ''} each, alternating", f"load {load_average()}"]
    return [
        Row("load", f"{case}: peak RSS (load + 1 forward) / weights' bytes", "x", ratio["anatomy"],
            ratio["transformers"], higher_is_better=False, notes=notes),
        Row("load", f"{case}: from_pretrained time, first call in a fresh process", "s", seconds["anatomy"],
            seconds["transformers"], higher_is_better=False, notes=notes),
        Row("load", f"{case}: from_pretrained time, second call", "s", warm["anatomy"], warm["transformers"],
            higher_is_better=False, notes=notes + ["anatomy reads every value once (refusing NaN/Inf); "
                                                   "transformers reads them in the first forward pass"]),
        Row("load", f"{case}: second call + first forward pass", "s", ready["anatomy"], ready["transformers"],
            higher_is_better=False, notes=notes),
    ]
