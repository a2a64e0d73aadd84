"""`anatomy circuits discover`: a behaviour's circuit over a dataset of clean/corrupted pairs.

    anatomy circuits discover --task ioi --model smollm2 --method eap-ig --out circuit.html
    anatomy circuits discover --task pairs.jsonl --model smollm2 --method eap --verify 50 --out circuit.safetensors

Edges are scored (EAP or EAP-IG), circuits of the top n edges are run with every other edge ablated
(the faithfulness curve), the smallest reaching --target is drawn (or --edges N), and --verify K
path-patches the top K edges exactly. Every argument is checked before the model loads.
"""

from __future__ import annotations

import argparse
import time

from ...cli import (add_model_argument, add_threads_argument, non_negative_int, output_file,
                    positive_int, printable, probability, summary_block)
from .edges import METHODS, MAX_STEPS
from .faithfulness import ABLATIONS
from .generators import TASKS
from .tasks import MAX_PAIRS


def task_name(value: str) -> str:
    """An argparse type: a built-in task or a .jsonl file of pairs that exists."""
    from pathlib import Path

    if value in TASKS:
        return value
    if value.endswith(".jsonl"):
        if not Path(value).is_file():
            raise argparse.ArgumentTypeError(f"no file {printable(value)}")
        return value
    raise argparse.ArgumentTypeError(f"{printable(value)} is not a task; allowed values: {', '.join(TASKS)}, "
                                     f"or a .jsonl file of pairs")


def at_most(limit: int, unit: str, why: str = ""):
    """An argparse type: a positive integer of `unit`s, at most `limit`."""

    def check(value: str) -> int:
        number = positive_int(value)
        if number > limit:
            raise argparse.ArgumentTypeError(f"{number} {unit} is more than {limit}{why}")
        return number

    return check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "a behaviour's circuit over clean/corrupted pairs: edge attribution, faithfulness, exact checks"
    parser.add_argument("--task", required=True, type=task_name,
                        help=f"{', '.join(TASKS)}, or a .jsonl file of {{clean, corrupt, answer, wrong}} pairs")
    add_model_argument(parser, default="smollm2", help="the model")
    parser.add_argument("--method", choices=METHODS, default="eap-ig", help="edge attribution (default eap-ig)")
    parser.add_argument("--steps", type=at_most(MAX_STEPS, "steps", " (each is a forward and a backward pass)"), default=5,
                        help="eap-ig: points on the path (default 5)")
    parser.add_argument("--pairs", type=at_most(MAX_PAIRS, "pairs"), default=100, metavar="N",
                        help="pairs the model gets right (default 100)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="the task generator's seed (default 0)")
    parser.add_argument("--ablation", choices=ABLATIONS, default="corrupt", help="what an ablated edge carries (default corrupt)")
    parser.add_argument("--target", type=probability, default=0.8, help="faithfulness the drawn circuit reaches (default 0.8)")
    parser.add_argument("--edges", type=positive_int, metavar="N", help="draw the top N edges instead")
    parser.add_argument("--verify", type=non_negative_int, default=0, metavar="K",
                        help="path-patch the top K edges exactly and compare (default 0: no)")
    parser.add_argument("--out", type=output_file(".html", ".htm", ".safetensors"),
                        help="the circuit: .html (the graph page) or .safetensors (the Graph)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_threads_argument(parser)  # the CPU: discovery's tensors are made there (no --device yet)


def run(args: argparse.Namespace) -> int:
    from ...checkpoints import from_pretrained
    from ...checkpoints.describe import config_of
    from .circuit import circuit_graph
    from .edges import attribute_edges
    from .faithfulness import faithfulness, kept_masks
    from .residual import ResidualGraph, edge_refusal
    from .generators import build_task
    from .verify import verify_edges
    from ..save import save

    config = config_of(args.model)
    why = None if config is None else edge_refusal(config)
    if why:
        raise ValueError(f"--model {printable(str(args.model))}: {why}")
    started = time.time()
    model = from_pretrained(args.model).eval()
    graph = ResidualGraph(model)  # refuses a model it cannot cut into components, before any work
    for name, value in (("--edges", args.edges), ("--verify", args.verify)):
        if value and value > graph.edge_count:
            raise ValueError(f"{name} {value}: choose 1 to {graph.edge_count}, the edges of this model's graph")
    task = build_task(model, args.task, args.pairs, seed=args.seed)
    loaded = time.time()
    progress, bar = _progress(args)
    with bar:
        result = attribute_edges(model, task, method=args.method, steps=args.steps, progress=progress("edges"))
        scored = time.time()
        curve = faithfulness(model, task, result, ablation=args.ablation, target=args.target, progress=progress("circuits"))
        curved = time.time()
        check = verify_edges(model, task, result, args.verify, progress=progress("verify")) if args.verify else None
    size = args.edges or curve.extra["smallest"] or graph.edge_count
    kept = kept_masks(graph, result, [size])[0]
    sizes = curve.extra["sizes"]
    reached = f"; they recover {curve.values[sizes.index(size)].item():.2f} of the gap" if size in sizes else ""
    about = f"{args.model}, {task.name}: {len(task)} pairs, {args.method}, the top {size} of {graph.edge_count:,} edges{reached}"
    circuit = circuit_graph(result, kept, about=about, meta={"model": str(args.model), "task": task.name})
    out = None
    if args.out:
        out = save(circuit, args.out)
    if not args.quiet:
        sizes, values = curve.extra["sizes"], curve.values.tolist()
        points = ", ".join(f"{n}: {v:.2f}" for n, v in zip(sizes, values))
        rows = [("model", printable(str(args.model))),
                ("task", f"{task.name}: {len(task)} pairs kept, {task.dropped} dropped (the model got them wrong)"),
                ("metric", f"clean {curve.extra['clean']:.3f}, ablated {curve.extra['ablated']:.3f}"),
                ("edges", f"{graph.edge_count:,} between {len(graph.sources)} sources and {len(graph.destinations)} inputs"),
                ("check", result.check), ("curve", points),
                ("circuit", f"{size} edges reach {values[sizes.index(size)]:.2f}" if size in sizes else f"{size} edges")]
        if check is not None:
            rows.append(("verified", check.check))
        rows.append(("time", f"loading {loaded - started:.1f} s, edges {scored - loaded:.1f} s, circuits "
                             f"{curved - scored:.1f} s" + (f", verifying {time.time() - curved:.1f} s" if check else "")))
        print(summary_block("anatomy circuits discover" + (f" -> {printable(str(out))}" if out else ""), rows))
    return 0


def _progress(args):
    """(progress(label) -> progress(done, total), a context manager): a bar on a terminal, nothing otherwise."""
    from contextlib import nullcontext

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if args.quiet or not console.is_terminal:
        return (lambda label: (lambda done, total: None)), nullcontext()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=console, transient=True)

    def for_stage(label: str):
        task = bar.add_task(label, total=None)
        return lambda done, total: bar.update(task, completed=done, total=total)

    return for_stage, bar
