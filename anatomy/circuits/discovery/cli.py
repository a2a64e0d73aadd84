"""`anatomy circuits discover`: a behaviour's circuit over a dataset of clean/corrupted pairs, or a ranking
of its nodes, by every method the library has.

    anatomy circuits discover --task ioi --method eap-ig --out circuit.html --roles 10
    anatomy circuits discover --task pairs.jsonl --method eap --verify 50 --out circuit.safetensors
    anatomy circuits discover --task ioi --method atp* --nodes heads --verify 20 --out heads.html
    anatomy circuits discover --task ioi --method acdc --threshold 0.01 --out acdc.html

Edges (--method eap, eap-ig; edges.py): every edge is scored, circuits of the top n edges are run with
every other edge ablated (the faithfulness curve), the smallest reaching --target is drawn (or --edges N),
and --verify K path-patches the top K edges exactly, and --outside N (default 4K) edges outside them,
to see what the estimate missed. ACDC (--method acdc; acdc.py) prunes edges one at a time by their exact
effect at --threshold, by the KL of the next token or the task's metric (--distance); its circuit's
faithfulness is measured as the curve's points are. Nodes (--method atp, atp*, ig; nodes.py): every
node of --nodes is scored, the strongest are listed, and --verify K patches the top K exactly. --roles N
names the N strongest heads by role (roles.py: name movers, induction, previous and duplicate token).
Every argument is checked before torch and the model load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...arguments import add_compute_arguments, add_model_argument, non_negative_float, non_negative_int, output_file, \
    positive_int, probability, within
from ...parser import closest
from ...progress import Stages
from ...terminal import printable, summary_block
from .choices import (ABLATIONS, ACDC_METRICS, CIRCUIT_METHODS, EDGE_METHODS, MAX_PAIRS, MAX_STEPS, NODE_KINDS,
                      NODE_METHODS, PATHS, TASKS, edge_refusal, node_refusal)

# The options each family of methods reads (None: the default below); any other given is refused, not ignored.
OPTIONS = {"path": ("eap-ig",), "steps": ("eap-ig", "ig"), "nodes": NODE_METHODS,
           "ablation": EDGE_METHODS + CIRCUIT_METHODS, "target": EDGE_METHODS, "edges": EDGE_METHODS,
           "outside": EDGE_METHODS, "threshold": CIRCUIT_METHODS, "distance": CIRCUIT_METHODS}
OUTSIDE = 4  # --verify K also path-patches OUTSIDE * K edges outside the top K, unless --outside says
DEFAULTS = {"path": "inputs", "steps": 5, "nodes": "heads", "ablation": "corrupt", "target": 0.8, "distance": "kl"}
OUTPUTS = {"edges": (".html", ".htm", ".safetensors"), "nodes": (".html", ".htm", ".png", ".svg")}
OUTPUTS["acdc"] = OUTPUTS["edges"]
TOP = 10  # the nodes listed
NODE_NAMES = {"heads": "heads", "q": "heads' queries", "k": "key heads' keys", "v": "value heads' values",
              "mlp": "MLPs", "neurons": "neurons"}


def task_name(value: str) -> str:
    """An argparse type: a built-in task or a .jsonl file of pairs that exists."""
    if value in TASKS:
        return value
    if value.endswith(".jsonl"):
        if not Path(value).is_file():
            raise argparse.ArgumentTypeError(f"no file {printable(value)}")
        return value
    meant = closest(value, TASKS)
    raise argparse.ArgumentTypeError(f"{printable(repr(value))} is not a task" + (f"; did you mean {meant!r}?" if meant else "")
                                     + f" (allowed values: {', '.join(TASKS)}, or a .jsonl file of pairs)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("a behaviour's circuit over clean/corrupted pairs (edges: eap, eap-ig), or a ranking of its "
                          "nodes (atp, atp*, ig), with the exact check of each and the heads' roles")
    parser.add_argument("--task", required=True, type=task_name,
                        help=f"{', '.join(TASKS)}, or a .jsonl file of {{clean, corrupt, answer, wrong}} pairs")
    add_model_argument(parser, default="smollm2", help="a decoder (edges, nodes) or a sequence classifier (nodes)")
    parser.add_argument("--method", choices=EDGE_METHODS + CIRCUIT_METHODS + NODE_METHODS, default="eap-ig",
                        help="edges: eap (attribution patching), eap-ig (integrated gradients), acdc (edges pruned by "
                             "their exact effect); nodes: atp, atp* (the QK fix and GradDrop), ig")
    parser.add_argument("--nodes", choices=NODE_KINDS,
                        help=f"atp, atp*, ig: what a node is: heads' outputs, their q, k or v, MLPs or neurons "
                             f"(default: {DEFAULTS['nodes']})")
    parser.add_argument("--path", choices=PATHS,
                        help="eap-ig: the input embeddings interpolated from corrupt to clean, or every edge moved "
                             f"together (auto-circuit's) (default: {DEFAULTS['path']})")
    parser.add_argument("--steps", type=within(positive_int, 1, MAX_STEPS, "steps", " (each is a forward and a "
                                               "backward pass)"), metavar="N",
                        help=f"eap-ig, ig: N points on the path from the corrupted input to the clean one, each a "
                             f"forward and a backward pass (the right Riemann sum k/N, Hanna et al.'s rule; analyze "
                             f"ig's --steps counts the same, at Gauss-Legendre points) (default: {DEFAULTS['steps']})")
    parser.add_argument("--pairs", type=within(positive_int, 1, MAX_PAIRS, "pairs"), default=100, metavar="N",
                        help="pairs the model gets right (default 100)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="the task generator's seed (default 0)")
    parser.add_argument("--ablation", choices=ABLATIONS,
                        help=f"eap, eap-ig: what an ablated edge carries (default: {DEFAULTS['ablation']})")
    parser.add_argument("--target", type=probability, metavar="P",
                        help=f"eap, eap-ig: faithfulness the drawn circuit reaches (default: {DEFAULTS['target']})")
    parser.add_argument("--edges", type=positive_int, metavar="N", help="eap, eap-ig: draw the top N edges instead")
    parser.add_argument("--threshold", type=non_negative_float, metavar="TAU",
                        help="acdc (required): an edge goes when leaving it out moves the circuit less than TAU from "
                             "the model")
    parser.add_argument("--distance", choices=ACDC_METRICS,
                        help="acdc: how far the circuit is from the model: kl (of the next token) or task (the "
                             f"metric lost) (default: {DEFAULTS['distance']})")
    parser.add_argument("--verify", type=non_negative_int, default=0, metavar="K",
                        help="patch the top K edges (or nodes) exactly and compare (default 0: no)")
    parser.add_argument("--outside", type=non_negative_int, metavar="N",
                        help=f"eap, eap-ig with --verify K: also patch N edges outside the top K, drawn at random from "
                             f"bands of rank, to see what the estimate missed (default {OUTSIDE}K)")
    parser.add_argument("--roles", type=positive_int, metavar="N",
                        help="name the N strongest heads (of the circuit, or of the ranking) by role")
    parser.add_argument("--out", type=output_file(*sorted(set(OUTPUTS["edges"] + OUTPUTS["nodes"]))),
                        help="edges: .html (the graph page) or .safetensors (the Graph); nodes: .html, .png or .svg "
                             "(the ranking's view)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_compute_arguments(parser)


def check_arguments(args: argparse.Namespace) -> str:
    """Every option against the method, and the model's config, before torch loads; returns the family,
    "edges" or "nodes", with the defaults of its options filled in."""
    family = "edges" if args.method in EDGE_METHODS else "acdc" if args.method in CIRCUIT_METHODS else "nodes"
    for option, users in OPTIONS.items():
        if getattr(args, option) is not None and args.method not in users:
            raise ValueError(f"--{option} is for --method {' and '.join(users)}, not {args.method}")
    for option, default in DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    if args.out and Path(args.out).suffix.lower() not in OUTPUTS[family]:
        raise ValueError(f"--out {printable(args.out)}: --method {args.method} writes {', '.join(OUTPUTS[family])}")
    if family == "acdc" and args.threshold is None:
        raise ValueError("--method acdc needs --threshold TAU (an edge goes when it moves the circuit less than TAU)")
    if family == "acdc" and args.verify:
        raise ValueError("--verify is for eap, eap-ig and the node methods: acdc tests every edge exactly already")
    if args.outside is not None and not args.verify:
        raise ValueError("--outside N samples edges outside the top K of --verify K: give --verify too")
    if args.roles and family == "nodes" and args.nodes != "heads":
        raise ValueError(f"--roles names heads: it needs --nodes heads, not {args.nodes}")
    from ...checkpoints.describe import config_of

    config = config_of(args.model)
    why = None if config is None else (node_refusal if family == "nodes" else edge_refusal)(config)
    if why:
        raise ValueError(f"--model {printable(str(args.model))}: {why}")
    return family


def run(args: argparse.Namespace) -> int:
    family = check_arguments(args)
    from ...checkpoints import from_pretrained
    from .generators import build_task

    with Stages.of(args) as stages:
        stages.start("loading the model")
        model = from_pretrained(args.model).to(args.device).eval()
        stages.start("the task")
        task = build_task(model, args.task, args.pairs, seed=args.seed)
        build = {"edges": edge_circuit, "acdc": acdc_circuit, "nodes": node_ranking}[family]
        rows, heads, out = build(args, model, task, stages)
        if args.roles:
            rows.append(("roles", head_roles_text(model, task, heads[:args.roles], stages)))
    if not args.quiet:
        rows.append(("time", stages.times()))
        print(summary_block("anatomy circuits discover" + (f" -> {printable(str(out))}" if out else ""),
                            [("model", printable(str(args.model))),
                             ("task", f"{task.name}: {len(task)} pairs kept, {task.dropped} dropped (the model got them "
                                      "wrong)"), *rows]))
    return 0


def edge_circuit(args, model, task, stages: Stages) -> tuple[list, list, Path | None]:
    """Score every edge, draw the faithfulness curve, write the circuit; (summary rows, the circuit's heads
    strongest first, the file written)."""
    from ..save import save
    from .circuit import circuit_for_page, circuit_graph
    from .edges import attribute_edges
    from .faithfulness import faithfulness, kept_masks
    from .figures import head_weights
    from .residual import ResidualGraph
    from .verify import verify_edges

    graph = ResidualGraph(model)  # refuses a model it cannot cut into components, before any work
    for name, value in (("--edges", args.edges), ("--verify", args.verify)):
        if value and value > graph.edge_count:
            raise ValueError(f"{name} {value}: choose 1 to {graph.edge_count}, the edges of this model's graph")
    result = attribute_edges(model, task, method=args.method, steps=args.steps, path=args.path,
                             progress=stages.start("scoring the edges", "passes"))
    curve = faithfulness(model, task, result, ablation=args.ablation, target=args.target,
                         progress=stages.start("the faithfulness curve", "circuits"))
    outside = OUTSIDE * args.verify if args.outside is None else args.outside
    check = verify_edges(model, task, result, args.verify, sample=outside,
                         progress=stages.start("verifying", "edges")) if args.verify else None
    sizes, values = curve.extra["sizes"], curve.values.tolist()
    size = args.edges or curve.extra["smallest"] or graph.edge_count
    kept = kept_masks(graph, result, [size])[0]
    reached = f"; they recover {values[sizes.index(size)]:.2f} of the gap" if size in sizes else ""
    steps = f" ({args.steps} steps, path {args.path})" if args.method == "eap-ig" else ""
    about = f"{args.model}, {task.name}: {len(task)} pairs, {args.method}{steps}, the top {size} of " \
            f"{graph.edge_count:,} edges{reached}"
    meta = {"model": str(args.model), "task": task.name}
    out = None
    if args.out and Path(args.out).suffix.lower() == ".safetensors":
        stages.start("writing")
        out = save(circuit_graph(result, kept, about=about, meta=meta), args.out)
    elif args.out:  # the page: the circuit grown from its smallest by a slider, beside the curve, heads by role
        stages.start("writing")  # the page: the heads' roles first (circuit_for_page)
        out = save(circuit_for_page(model, task, result, curve, size=size, about=about, meta=meta), args.out)
    weights = head_weights(graph, result.values, kept)
    rows = [("metric", f"clean {curve.extra['clean']:.3f}, ablated {curve.extra['ablated']:.3f}"),
            ("edges", f"{graph.edge_count:,} between {len(graph.sources)} sources and {len(graph.destinations)} inputs"),
            ("check", result.check), ("curve", ", ".join(f"{n}: {v:.2f}" for n, v in zip(sizes, values))),
            ("circuit", f"{size} edges reach {values[sizes.index(size)]:.2f}" if size in sizes else f"{size} edges")]
    if check is not None:
        rows.append(("verified", check.check))
    return rows, sorted(weights, key=weights.get, reverse=True), out


def acdc_circuit(args, model, task, stages: Stages) -> tuple[list, list, Path | None]:
    """Prune every edge by ACDC at --threshold, measure the circuit's faithfulness, write it; (summary rows,
    the circuit's heads strongest first, the file written)."""
    from ..save import save
    from .acdc import acdc
    from .circuit import circuit_graph
    from .faithfulness import circuit_faithfulness
    from .figures import head_weights

    result = acdc(model, task, threshold=args.threshold, metric=args.distance,
                  progress=stages.start("pruning the edges", "edges"))
    graph, kept = result.extra["graph"], result.extra["kept"]
    stages.start("the circuit's faithfulness")
    faithful = float(circuit_faithfulness(model, task, graph, kept[None], ablation=args.ablation)[0])
    size = int(kept.sum())
    about = f"{args.model}, {task.name}: {len(task)} pairs, acdc (τ = {args.threshold:g}, {args.distance}), " \
            f"{size} of {graph.edge_count:,} edges kept; they recover {faithful:.2f} of the gap"
    out = None
    if args.out:
        stages.start("writing")
        out = save(circuit_graph(result, kept, about=about, meta={"model": str(args.model), "task": task.name}), args.out)
    weights = head_weights(graph, result.values, kept)
    rows = [("edges", f"{graph.edge_count:,} between {len(graph.sources)} sources and {len(graph.destinations)} inputs, "
                      f"tested in reverse topological order ({result.extra['runs']:,} circuits run)"),
            ("check", result.check), ("circuit", f"{size} edges recover {faithful:.2f} of the gap ({args.ablation} "
                                                 f"ablation)")]
    return rows, sorted(weights, key=weights.get, reverse=True), out


def node_ranking(args, model, task, stages: Stages) -> tuple[list, list, Path | None]:
    """Score every node of --nodes, list the strongest, write the ranking's view; (summary rows, the heads
    strongest first when the nodes are heads, the file written)."""
    from .nodes import attribute_nodes
    from .verify import _node_name, verify_nodes

    result = attribute_nodes(model, task, kind=args.nodes, method=args.method, steps=args.steps,
                             progress=stages.start(f"scoring the {NODE_NAMES[args.nodes]}", "passes"))
    count = result.values.numel()
    if args.verify > count:
        raise ValueError(f"--verify {args.verify}: choose 1 to {count}, the {NODE_NAMES[args.nodes]} of this model")
    check = verify_nodes(model, task, result, args.verify, progress=stages.start("verifying", "passes")) \
        if args.verify else None
    width = 1 if result.values.dim() == 1 else result.values.size(1)
    order = result.values.flatten().abs().argsort(descending=True).tolist()
    top = ", ".join(f"{_node_name(args.nodes, i // width, i % width)} {result.values.flatten()[i].item():+.3g}"
                    for i in order[:TOP])
    out = None
    if args.out:
        stages.start("writing")
        out = result.save(args.out)
    rows = [("nodes", f"{count:,} {NODE_NAMES[args.nodes]} scored by {args.method}" +
             (f" ({args.steps} steps)" if args.method == "ig" else "") + ("; unsigned" if args.method == "atp*" else "")),
            ("strongest", top)]
    if check is not None:
        rows.append(("verified", check.check))
    heads = [divmod(i, width) for i in order] if args.nodes == "heads" else []
    return rows, heads, out


def head_roles_text(model, task, heads: list[tuple[int, int]], stages: Stages) -> str:
    """"L23H0 name mover, L5H3 induction, L9H1 (none)": each head's roles (roles.head_roles), strongest first."""
    from .roles import head_roles

    stages.start("the heads' roles")
    roles = head_roles(model, task, heads)["roles"]
    return ", ".join(f"L{layer}H{head} {' and '.join(roles[(layer, head)]) or '(none)'}" for layer, head in heads)
