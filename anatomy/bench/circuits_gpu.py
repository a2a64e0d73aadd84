"""Attribution graphs and circuit discovery on a GPU: one short prepared script for a machine lent for minutes.

    python -m anatomy.bench.circuits_gpu OUT_DIR --tokenizer DIR [--quick]
    python -m anatomy.bench.circuits_gpu --table OUT_DIR/gpu.jsonl      # its lines as the bench's table rows

Cases, each with its seconds (the device synchronised), the device's peak memory and the graph's own check line,
written to OUT_DIR/gpu.jsonl one line per case as it finishes (a run stopped at its limit keeps what it did):

- a SmolLM2-135M-shaped model (random weights: SmolLM2's own do not travel with the working tree), prompts of
  16, 64, 256 and 1,024 tokens, capped at 8,192 feature nodes, float32, then the pruned graph's attention
  explained (--qk's work);
- the 2B-shaped Llama of circuits_scale (Gemma-2-2B's shape), 64 tokens, weights and 26 x 16,384
  JumpReLU transcoders in bfloat16 read in float32, capped at 8,192;
- `anatomy circuits ... --device cuda` and `anatomy circuits discover --task ioi --device cuda` (EAP-IG with
  --verify and --outside; AtP* with --roles) on the SmolLM2-shaped model saved with SmolLM2's tokenizer (the
  folder given with --tokenizer), end to end through the command line.

Every set is random and calibrated on its prompt (circuit_sets.py), as the CPU bench's are, so that the timings
transfer to trained sets of the same width and sparsity. --quick: the same code on the CPU at toy sizes (tests).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from .circuits_scale import CAP, SHAPE_2B

SHAPE_SMOLLM2 = dict(arch="decoder", vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, d_head=64, n_layers=30,
                     d_ff=1536, max_seq_len=8192, pos_encoding="rotary", norm="rmsnorm", activation="swiglu",
                     rope_theta=100000.0, tie_embeddings=True, norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                     pad_token_id=2)
# the rows of a command's summary kept in its table row
KEPT = ("task", "graph", "check", "pruned", "circuit", "verified", "nodes", "roles", "time")
QUICK_SHAPE = dict(SHAPE_SMOLLM2, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128)


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def one_graph(name: str, shape: dict, length: int, cap: int, dtype: torch.dtype, features: int, qk: int, *,
              device: torch.device) -> dict:
    """Build the model and its calibrated set on the CPU, move both to `device`, then time the capped graph,
    its pruning and scores, and (qk > 0) the pruned graph's attention explained."""
    from .. import ModelConfig, build_model
    from ..circuits import attribution_graph, prune, pruned, scores
    from ..circuits.attention_edges import explain_attention
    from .circuit_sets import calibrated_random_transcoders

    made = time.perf_counter()
    model = build_model(ModelConfig(**shape), seed=0).to(dtype).eval()
    ids = torch.randint(3, shape["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    ids[0] = shape["bos_token_id"]
    transcoders = calibrated_random_transcoders(model, ids[None], features=features, dtype=dtype)
    model, transcoders = model.to(device), transcoders.to(device)
    made = time.perf_counter() - made
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronise(device)
    start = time.perf_counter()
    graph = attribution_graph(model, ids, transcoders, max_feature_nodes=cap)
    synchronise(device)
    attributed = time.perf_counter() - start
    decision = prune(graph, 0.8, 0.98)
    small = pruned(graph, decision=decision)
    replacement, completeness = scores(graph, decision.influence)
    synchronise(device)
    seconds = time.perf_counter() - start
    peak = peak_gb(device)
    qk_seconds = None
    if qk:
        qk_start = time.perf_counter()
        explain_attention(model, transcoders, small, n=qk)
        synchronise(device)
        qk_seconds = time.perf_counter() - qk_start
    return {"case": name, "tokens": length, "cap": cap, "dtype": str(dtype).removeprefix("torch."),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "made_seconds": made, "attribute_seconds": attributed, "seconds": seconds, "peak_gb": peak,
            "qk_edges": qk, "qk_seconds": qk_seconds, "nodes": len(graph), "active": graph.meta["features_active"],
            "kept_nodes": len(small), "replacement": replacement, "completeness": completeness,
            "check": graph.check, "pruned_check": small.check}


def commands(folder: Path, tokenizer: Path, device: str, quick: bool) -> list[dict]:
    """The graph and discovery commands on the SmolLM2-shaped model, end to end, their exit codes and output."""
    from .. import ModelConfig, build_model
    from ..checkpoints.tokenizer import Tokenizer
    from ..sae import save_transcoders
    from .circuit_sets import calibrated_random_transcoders

    model = build_model(ModelConfig(**(QUICK_SHAPE if quick else SHAPE_SMOLLM2)), seed=0).eval()
    model.tokenizer = Tokenizer.load(tokenizer)
    model.save_pretrained(folder / "model")
    prompt = "When Mary and John went to the store, John gave a drink to"
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    save_transcoders(calibrated_random_transcoders(model, ids, features=256 if quick else 2304),
                     folder / "transcoders", scan="anatomy-bench/random-calibrated")
    pairs, verify, outside = ("8", "5", "8") if quick else ("100", "50", "200")
    graph = ["circuits", prompt, "--model", str(folder / "model"), "--transcoders", str(folder / "transcoders"),
             "--out", str(folder / "graph.json"), "--qk", "5"]
    discover = ["circuits", "discover", "--task", "ioi", "--model", str(folder / "model"), "--pairs", pairs,
                "--verify", verify, "--outside", outside]
    nodes = ["circuits", "discover", "--task", "ioi", "--model", str(folder / "model"), "--pairs", pairs,
             "--method", "atp*", "--roles", "5"]
    runs = []
    for label, argv in (("anatomy circuits PROMPT --qk 5 (the IOI prompt)", graph),
                        (f"anatomy circuits discover --task ioi --pairs {pairs} --verify {verify} --outside {outside}",
                         discover),
                        (f"anatomy circuits discover --task ioi --pairs {pairs} --method atp* --roles 5", nodes)):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "import sys; from anatomy.cli import main; sys.exit(main())",
                               *argv, "--device", device, "--no-progress"], capture_output=True, text=True)
        runs.append({"case": label, "seconds": time.perf_counter() - start, "returncode": done.returncode,
                     "output": (done.stdout + done.stderr)[-3000:]})
    return runs


def rows_of(lines: list[dict]) -> list:
    """The bench's Rows of gpu.jsonl's lines: a graph's seconds, or a command's."""
    from .common import Row, fmt

    rows = []
    for line in lines:
        if "failed" in line:
            rows.append(Row("gpu", f"{line['case']}, {line['tokens']:,} tokens", "s", float("nan"), None, False,
                            [f"failed: {line['failed'][:300]}"]))
        elif "returncode" in line:
            printed = [text for text in line["output"].splitlines() if text.strip()]
            fields: dict[str, str] = {}  # the summary block's rows: "  key   text" and its indented continuations
            for text in printed:
                key, _, rest = text.strip().partition("  ")
                if text.startswith("  ") and not text.startswith("   ") and rest:
                    fields[key] = rest.strip()
                elif text.startswith("   ") and fields:
                    fields[list(fields)[-1]] += " " + text.strip()
            shown = [f"{key}: {fields[key]}" for key in KEPT if key in fields] or printed[-1:]
            rows.append(Row("gpu", line["case"] + " --device cuda (end to end, loading included)", "s", line["seconds"],
                            None, False, [f"exit {line['returncode']}", *shown]))
        else:
            qk = f"; --qk {line['qk_edges']}: {fmt(line['qk_seconds'])} s more" if line["qk_edges"] else ""
            rows.append(Row("gpu", f"capped graph, {line['case']} ({line['dtype']}), {line['tokens']:,} tokens, "
                                   f"{line['cap']:,} feature nodes", "s", line["seconds"], None, False,
                            [f"{line['device']}: graph {fmt(line['attribute_seconds'])} s, pruned and scored "
                             f"{fmt(line['seconds'])} s, peak {fmt(line['peak_gb'])} GB of GPU memory{qk}; "
                             f"{line['nodes']:,} nodes of {line['active']:,} active features; {line['check']}"]))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m anatomy.bench.circuits_gpu")
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--tokenizer", type=Path, help="a folder with SmolLM2's tokenizer.json")
    parser.add_argument("--quick", action="store_true", help="toy sizes on the CPU: the script's own test")
    parser.add_argument("--table", type=Path, metavar="JSONL", help="print a run's lines as the bench's table")
    args = parser.parse_args(argv)
    if args.table:
        from .cli import table

        print(table(rows_of([json.loads(line) for line in args.table.read_text().splitlines()])))
        return
    if args.out is None or args.tokenizer is None:
        parser.error("OUT_DIR and --tokenizer are needed to run the cases")
    device = torch.device("cpu" if args.quick else "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "gpu.jsonl"

    def record(result: dict) -> None:
        with log.open("a") as file:
            file.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)

    if args.quick:
        cases = [("smollm2-shaped", QUICK_SHAPE, 16, 30, torch.float32, 256, 3),
                 ("2b-shaped", QUICK_SHAPE, 24, 30, torch.bfloat16, 512, 0)]
    else:
        cases = [("smollm2-shaped", SHAPE_SMOLLM2, length, CAP, torch.float32, 2304, 20) for length in (16, 64, 256)]
        cases += [("2b-shaped", SHAPE_2B | {"bos_token_id": 2}, 64, CAP, torch.bfloat16, 16384, 20)]
        cases += [("smollm2-shaped", SHAPE_SMOLLM2, 1024, CAP, torch.float32, 2304, 0)]
    for result in commands(args.out / "work", args.tokenizer, device.type, args.quick):
        record(result)
    for case in cases:
        try:
            record(one_graph(*case, device=device))
        except Exception as error:  # a case that fails says so and the next one runs
            record({"case": case[0], "tokens": case[2], "failed": f"{type(error).__name__}: {error}"[:2000]})
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
