"""Attribution graphs at the size people study, capped at 8,192 feature nodes: long prompts and a 2B-shaped model,
anatomy beside circuit-tracer 0.5.0 on the same weights and prompt ids.

    SmolLM2-135M, 16, 64, 256 and 1,024 tokens       goals: 256 tokens <= 2 min and 4 GB, 1,024 <= 10 min and 8 GB
    a Gemma-2-2B-shaped Llama, 64 tokens               goal: <= 10 min and 16 GB

The 2B shape: 26 layers, d_model 2304, 8 heads of 256 with 4 key/value heads, d_ff 9216, a 256,000-token
vocabulary (a Llama until Gemma 2 is supported), random weights held in bfloat16; its transcoders 26 x 16,384
JumpReLU features in bfloat16, read in float32 by anatomy (vectors.py). Every set is random, calibrated to fire
42 features per token and layer (circuit_sets.py). The prompt is a fixed paragraph, repeated to the length.

Each side runs in a process of its own, one after the other, under a watchdog that stops it when its resident
memory passes what the machine had free when it started (its row then says where). anatomy is given
--max-memory the goal less what the model and the transcoders hold (a capped graph then keeps the rows past it
in a temporary file); circuit-tracer runs its nnsight backend at batch 128, and is stopped at twice a row's goal
(its row then says how many feature rows it had made, and how long all would take at that rate). The seconds are wall-clock; the
notes give the CPU seconds and the peak resident memory (VmHWM) of each. --quick: the tests' tiny Llama at 16
and 48 tokens, capped at 30 features. The long rows (and the last quick one) run again with their rows crossing
attention in bfloat16 (--attention-products bfloat16), anatomy's side alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .circuits import FIXTURES, WORKER, compare, run
from .common import Row, Settings, load_average
from .peers import peer_python

PARAGRAPH = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp of oil and "
             "a notebook in which he wrote the weather, the ships that passed, and the birds that rested on the "
             "rail. In winter the storms came from the north, and the waves broke so high against the rocks that "
             "salt crusted the windows of the lantern room. His daughter, who had moved to the capital to study "
             "engineering, wrote to him every month about bridges and the mathematics of load and tension. ")
CAP = 8192
LENGTHS = (16, 64, 256, 1024)
GOALS = {256: (120, 4), 1024: (600, 8), "2b": (600, 16)}  # seconds, GB
IN_BFLOAT16 = "rows across attention in bfloat16"  # --attention-products bfloat16
TIME_LIMIT = 2  # circuit-tracer is stopped at twice a goal's seconds (its row then says how far it got)
SHAPE_2B = dict(arch="decoder", vocab_size=256_000, d_model=2304, n_heads=8, n_kv_heads=4, d_head=256, n_layers=26,
                d_ff=9216, max_seq_len=8192, pos_encoding="rotary", norm="rmsnorm", activation="swiglu")


def prompt_of(tokenizer, length: int) -> list[int]:
    """BOS and the paragraph's first length - 1 tokens (repeated as needed)."""
    ids = tokenizer.encode(PARAGRAPH * (1 + length // 80), add_special_tokens=False)[:length - 1]
    return [tokenizer.bos_id] + ids


def prepare_smollm2(folder: Path, length: int) -> tuple[Path, Path, list[int]]:
    """SmolLM2's Hugging Face folder (written once) and a set calibrated on this prompt."""
    from ..checkpoints import from_pretrained
    from ..sae import save_transcoders
    from .circuit_sets import calibrated_random_transcoders
    from .circuits import write_model

    model = from_pretrained("smollm2").eval()
    ids = prompt_of(model.tokenizer, length)
    model_folder = folder / "smollm2"
    if not model_folder.exists():
        write_model(model, model_folder)
    transcoders = calibrated_random_transcoders(model, torch.tensor([ids]))
    save_transcoders(transcoders, folder / f"transcoders-{length}", scan="anatomy-bench/random-calibrated")
    return model_folder, folder / f"transcoders-{length}", ids


def prepare_2b(folder: str) -> None:
    """(python -m anatomy.bench.circuits_scale prepare FOLDER) The 2B-shaped model and its set, in bfloat16, written
    to FOLDER/model and FOLDER/transcoders, and the prompt's ids to FOLDER/ids.json; a process of its own."""
    from .. import ModelConfig, build_model
    from ..checkpoints import from_pretrained
    from ..sae import save_transcoders
    from .circuit_sets import calibrated_random_transcoders
    from .circuits import write_model

    folder = Path(folder)
    torch.set_default_dtype(torch.bfloat16)  # made in bfloat16: a float32 copy would be 10.5 GB
    model = build_model(ModelConfig(**SHAPE_2B), seed=0).to(torch.bfloat16).eval()  # its buffers too
    torch.set_default_dtype(torch.float32)
    tokenizer = from_pretrained("smollm2").tokenizer  # token ids only: any 64 ids below the vocabulary do
    ids = prompt_of(tokenizer, 64)
    model.tokenizer = tokenizer  # saved beside the weights: circuit-tracer's loader reads a tokenizer from the folder
    transcoders = calibrated_random_transcoders(model, torch.tensor([ids]), features=16384, dtype=torch.bfloat16)
    write_model(model, folder / "model")
    save_transcoders(transcoders, folder / "transcoders", scan="anatomy-bench/random-calibrated")
    (folder / "ids.json").write_text(json.dumps(ids))


def both_sides(settings: Settings, folder: Path, model_folder: Path, transcoder_folder: Path, ids: list[int],
               options: dict, python: str | None) -> tuple[dict, dict | None, tuple[float, int] | None]:
    """(anatomy's JSON, circuit-tracer's or None, (max |diff| of the adjacencies, their nodes ours lacks) or None)."""
    threads = 1 if settings.quick else 2
    options = dict(options, prompt_ids=ids, threads=threads)
    for name in ("anatomy", "circuit-tracer"):
        (folder / f"{name}.json").unlink(missing_ok=True)
    ours = run([sys.executable, "-m", "anatomy.bench.circuits", str(model_folder), str(transcoder_folder),
                str(folder / "anatomy.json"), json.dumps(options)], folder / "anatomy.json", threads)
    if not python:
        return ours, None, None
    theirs = run([python, str(WORKER), str(model_folder), str(transcoder_folder), str(folder / "circuit-tracer.json"),
                  json.dumps(options)], folder / "circuit-tracer.json", threads)
    same = "stopped" not in theirs and options.get("compare")
    return ours, theirs, compare(folder / "anatomy.safetensors", folder / "circuit-tracer.safetensors") if same else None


def row_of(case: str, goal: tuple[float, float] | None, ours: dict, theirs: dict | None,
           difference: tuple[float, int] | None, how: str) -> Row:
    if "stopped" in ours:
        raise RuntimeError(f"anatomy's side of {case!r} stopped: {ours['stopped']}")
    row = Row("circuits", case, "s", ours["seconds"], theirs.get("seconds") if theirs and "stopped" not in theirs else None,
              False)
    budget = f"{ours['max_memory_gb']:.2f} GB" if ours["max_memory_gb"] else "none"
    met = "" if goal is None else (f"; goal <= {goal[0]:g} s and <= {goal[1]:g} GB: "
                                   + ("met" if ours["seconds"] <= goal[0] and ours["peak_gb"] <= goal[1] else "not met"))
    row.notes = [how, f"anatomy: graph {ours['attribute_seconds']:.1f} s, pruned and scored {ours['seconds']:.1f} s "
                      f"({ours['cpu_seconds']:.0f} s of CPU), peak {ours['peak_gb']:.2f} GB (loaded {ours['loaded_gb']:.2f} GB, "
                      f"--max-memory {budget}){met}; memory said before: {ours['memory']}"
                      + (f" ({ours['file_gb']:.2f} GB written)" if ours.get("file_gb") else "") + "; "
                      f"{ours['nodes']:,} nodes of {ours['active']:,} active features; {ours['check']}"]
    if theirs and "stopped" in theirs:
        row.notes.append(f"circuit-tracer 0.5.0 stopped: {theirs['stopped']}")
    elif theirs:
        row.notes.append(f"circuit-tracer {theirs['version']} (nnsight, batch {theirs['batch_size']}): attribute "
                         f"{theirs['attribute_seconds']:.1f} s, prune_graph {theirs['prune_seconds']:.1f} s "
                         f"({theirs['cpu_seconds']:.0f} s of CPU), peak {theirs['peak_gb']:.2f} GB")
    if difference is not None:
        other = f" ({difference[1]} of circuit-tracer's features chosen otherwise)" if difference[1] else ""
        row.notes.append(f"same adjacency: max |diff| {difference[0]:.2g}{other}")
    row.notes.append(f"one process a side, one after the other; load {load_average()}")
    return row


def bench_circuits_scale(settings: Settings) -> list[Row]:
    python, how = peer_python("circuit-tracer", install=not settings.quick)
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        if settings.quick:
            for length in (16, 48):
                ids = [1] + [3 + (7 * i) % 19 for i in range(length - 1)]
                options = {"max_feature_nodes": 30, "batch_size": 4, "compare": True, "qk": False}  # two rankings, as circuit-tracer's
                ours, theirs, difference = both_sides(settings, folder, FIXTURES / "llama", FIXTURES / "plt_jumprelu",
                                                      ids, options, python)
                rows.append(row_of(f"capped graph, tiny Llama, {length} tokens, 30 feature nodes", None, ours, theirs,
                                   difference, how))
            ours, _, _ = both_sides(settings, folder, FIXTURES / "llama", FIXTURES / "plt_jumprelu", ids,
                                    dict(options, compare=False, attention_products="bfloat16"), None)
            rows.append(row_of(f"capped graph, tiny Llama, {length} tokens, 30 feature nodes, {IN_BFLOAT16}", None, ours,
                               None, None, "anatomy only"))
            return rows
        for length in LENGTHS:
            model_folder, transcoder_folder, ids = prepare_smollm2(folder, length)
            goal = GOALS.get(length)
            options = {"max_feature_nodes": CAP, "batch_size": 128, "memory_goal_gb": goal[1] if goal else None,
                       "compare": length <= 64, "qk": False, "time_limit_s": TIME_LIMIT * goal[0] if goal else None}
            ours, theirs, difference = both_sides(settings, folder, model_folder, transcoder_folder, ids, options, python)
            rows.append(row_of(f"capped graph, SmolLM2-135M, {length:,} tokens, {CAP:,} feature nodes, 2 threads", goal,
                               ours, theirs, difference, how))
            if goal:  # the long rows again, their rows crossing attention in bfloat16
                ours, _, _ = both_sides(settings, folder, model_folder, transcoder_folder, ids,
                                        dict(options, compare=False, attention_products="bfloat16"), None)
                rows.append(row_of(f"capped graph, SmolLM2-135M, {length:,} tokens, {CAP:,} feature nodes, 2 threads, "
                                   f"{IN_BFLOAT16}", goal, ours, None, None, "anatomy only"))
        subprocess.run([sys.executable, "-m", "anatomy.bench.circuits_scale", "prepare", str(folder / "2b")], check=True,
                       timeout=3600)
        ids = json.loads((folder / "2b" / "ids.json").read_text())
        options = {"max_feature_nodes": CAP, "batch_size": 128, "dtype": "bfloat16", "memory_goal_gb": GOALS["2b"][1],
                   "qk": False, "time_limit_s": TIME_LIMIT * GOALS["2b"][0]}
        ours, theirs, difference = both_sides(settings, folder, folder / "2b" / "model", folder / "2b" / "transcoders",
                                              ids, options, python)
        rows.append(row_of(f"capped graph, 2B-shaped Llama (bfloat16), 26 x 16,384 transcoders (bfloat16), 64 tokens, "
                           f"{CAP:,} feature nodes, 2 threads", GOALS["2b"], ours, theirs, difference, how))
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["prepare"]:
    prepare_2b(sys.argv[2])
