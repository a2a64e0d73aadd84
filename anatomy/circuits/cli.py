"""`anatomy circuits TEXT --transcoders RUN --out graph.html|graph.json|graph.safetensors`.

    anatomy circuits "The capital of Germany is" --transcoders runs/transcoders --out graph.html
    anatomy circuits "..." --transcoders runs/transcoders --out graph.json   # Neuronpedia's format
    anatomy circuits "..." --transcoders runs/transcoders --out g.html g.json g.safetensors  # all three
    anatomy circuits --prompt discover --transcoders runs/transcoders --out g.html   # a prompt that is the word
    anatomy circuits discover ...                    # circuits over a dataset (anatomy.circuits.discovery.cli)

The graph explains the most likely next tokens (until --logit-probability, at most --max-logits) through
the transcoders' features, on the model the transcoders name (or --model); it is pruned at --node-threshold
and --edge-threshold for the page and the JSON, and written whole to a .safetensors file. The --qk strongest
edges across positions of the pruned graph are split by the heads they cross, and each one's largest heads'
attention scores split into pairs of nodes (attention_edges.py): every output carries them. Every argument is
checked before the model loads.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

from ..arguments import (add_compute_arguments, add_model_argument, input_file, non_negative_int, output_file,
                         positive_float, positive_int, probability, text)
from ..heap import GRAPH_THRESHOLD, return_large_buffers
from ..progress import Stages
from ..terminal import printable, summary_block
from .checks import ATTENTION_PRODUCTS, MAX_CHANGE, number

HANDED_ON = {"discover": "anatomy.circuits.discovery.cli"}  # `anatomy circuits discover ...`, before parsing
CHANGE = re.compile(r"^(\d+):(\d+)(?:@(\d+))?(?:=(-?[0-9.]+(?:e-?\d+)?))?$")
POWERS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # memory's sizes, in powers of 1024
SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?$", re.IGNORECASE)


def memory_size(text: str) -> int:
    """An argparse type: bytes, as 8G, 512M, 1.5GiB or a number of bytes (K, M, G, T: powers of 1024)."""
    match = SIZE.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 8G, 512M, 1.5GiB)")
    return int(float(match.group(1)) * POWERS[match.group(2).upper()])


def feature_change(kind: str):
    """An argparse type for --ablate L:F[@P], --clamp L:F[@P]=V, --steer L:F[@P]=A (layer, feature, position):
    a function that makes the FeatureChange once the arguments are checked (interventions.py imports torch)."""
    def parse(text: str):
        match = CHANGE.match(text.strip())
        if not match or (kind != "ablate") != (match.group(4) is not None):
            form = "LAYER:FEATURE[@POSITION]" + ("" if kind == "ablate" else "=VALUE")
            raise argparse.ArgumentTypeError(f"{text!r} is not {form} (e.g. 12:345@4{'' if kind == 'ablate' else '=2.5'})")
        layer, feature = int(match.group(1)), int(match.group(2))
        position = None if match.group(3) is None else int(match.group(3))
        try:  # 1e999 is inf, 1.2.3 no number: the value FeatureChange would refuse, refused here
            amount = None if match.group(4) is None else float(match.group(4))
            number(f"the {'added ' if kind == 'steer' else ''}value", amount, low=-MAX_CHANGE, high=MAX_CHANGE, none=True)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
        return lambda FeatureChange: (FeatureChange(layer, feature, position, add=amount) if kind == "steer" else
                                      FeatureChange(layer, feature, position, value=0.0 if kind == "ablate" else amount))
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`anatomy circuits TEXT ...` (and, handed on before parsing, `anatomy circuits discover ...`)."""
    parser.description = ("the attribution graph of TEXT's next token through transcoder features "
                          "(`anatomy circuits discover --help`: circuits over a dataset)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("text", metavar="TEXT", type=text, nargs="?", help="the prompt whose next token to explain")
    prompt.add_argument("--prompt", type=text, metavar="TEXT",
                        help="the prompt, as an option: for one that is the word 'discover' (`anatomy circuits "
                             "--prompt discover ...`) or that starts with '-'")
    add_model_argument(parser, named_by="the transcoder set's files", help="the model the transcoders replace the "
                       "MLPs of")
    parser.add_argument("--transcoders", required=True, metavar="SET",
                        help="a transcoder set: a run folder, circuit-tracer's or Gemma Scope's files, a Hub id "
                             "(org/name[/folder]), or circuit-tracer's names gemma and llama")
    parser.add_argument("--out", required=True, nargs="+", type=output_file(".html", ".htm", ".json", ".safetensors"),
                        help="one or more of .html (the page), .json (Neuronpedia's format), .safetensors (the whole "
                             "graph): one graph, written to each")
    parser.add_argument("--max-logits", type=positive_int, default=10, metavar="N", help="at most this many output tokens (default 10)")
    parser.add_argument("--logit-probability", type=probability, default=0.95, metavar="P",
                        help="output tokens until their probability adds up to this (default 0.95)")
    parser.add_argument("--node-threshold", type=probability, default=0.8, metavar="P",
                        help="pruning: keep the nodes holding this share of the influence (default 0.8)")
    parser.add_argument("--edge-threshold", type=probability, default=0.98, metavar="P",
                        help="pruning: keep the edges holding this share of the edge influence (default 0.98)")
    parser.add_argument("--max-feature-nodes", type=positive_int, metavar="N",
                        help="compute only this many features' rows, chosen by partial influence as circuit-tracer "
                             "does (bounds the time and the memory)")
    parser.add_argument("--max-memory", type=memory_size, metavar="SIZE",
                        help="what the graph may take in memory beyond the model and the transcoders, e.g. 8G (default: "
                             "what is available); a capped graph keeps the rows past it in a temporary file")
    parser.add_argument("--attention-products", choices=ATTENTION_PRODUCTS, default="float32",
                        help="the dtype rows cross attention in: bfloat16 runs those products about 3x as fast on "
                             "CPUs with bfloat16 instructions (a long prompt's graph 12-15%% faster), each attention's "
                             "share within about 0.5%% (the check line says what it costs); default float32")
    parser.add_argument("--qk", type=non_negative_int, default=20, metavar="N",
                        help="why attention attends: the N strongest edges across positions of the pruned graph split "
                             "by head, and each one's largest heads' scores split into pairs of nodes (default 20; "
                             "0: none)")
    parser.add_argument("--contexts", nargs="+", type=input_file, metavar="FILE",
                        help="text files to find each feature's top contexts in, for the page")
    parser.add_argument("--max-context-tokens", type=positive_int, default=20_000, metavar="N",
                        help="read at most this many tokens of --contexts (default 20000)")
    parser.add_argument("--context-seconds", type=positive_float, default=30.0, metavar="S",
                        help="stop reading --contexts after about this many seconds (default 30)")
    g = parser.add_argument_group("interventions: test the graph on the model")
    g.add_argument("--ablate", nargs="+", default=[], type=feature_change("ablate"), metavar="L:F[@P]",
                   help="set a feature to 0 (at position P, else everywhere)")
    g.add_argument("--clamp", nargs="+", default=[], type=feature_change("clamp"), metavar="L:F[@P]=V",
                   help="set a feature to V")
    g.add_argument("--steer", nargs="+", default=[], type=feature_change("steer"), metavar="L:F[@P]=A",
                   help="add A to a feature (its decoder vector, A times)")
    g.add_argument("--freeze", choices=("none", "attention", "all"), default="attention",
                   help="what the intervened model holds at the prompt's values: nothing, the attention patterns, "
                        "or everything but the change (direct effects, which the graph predicts exactly)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_compute_arguments(parser)


def run(args) -> int:
    """Load, build, check, prune, describe, write (module docstring)."""
    from ..checkpoints import from_pretrained
    from ..sae import load_transcoders
    from .attribute import attribution_graph, check_fits
    from .interventions import FeatureChange, intervene

    prompt = args.text if args.text is not None else args.prompt  # one of them: the parser says so
    return_large_buffers(GRAPH_THRESHOLD)  # a long prompt's large temporaries handed back when freed (heap.py)
    with Stages.of(args) as stages:
        stages.start("loading the transcoders")
        transcoders = load_transcoders(args.transcoders, mlp_out_norm=mlp_out_normed(args.model))
        name = args.model or transcoders.metadata.get("model_name")
        if not name:
            raise ValueError(f"{args.transcoders} does not name the model it was trained on: pass --model")
        if not args.model and mlp_out_normed(name):  # the model the set names normalises its MLP's output
            transcoders = load_transcoders(args.transcoders, mlp_out_norm=True)
        stages.start("loading the model")
        model = from_pretrained(name).to(args.device).eval()
        if getattr(model, "tokenizer", None) is None:
            raise ValueError(f"{name!r} has no tokenizer: the text cannot be read")
        check_fits(model, transcoders)
        transcoders = transcoders.to(args.device)  # on the model's device, as every tensor of the graph
        graph = attribution_graph(model, prompt, transcoders, max_logits=args.max_logits,
                                  logit_probability=args.logit_probability, max_feature_nodes=args.max_feature_nodes,
                                  max_bytes=args.max_memory, attention_products=args.attention_products,
                                  progress=stages.start("the graph", "rows"))
        graph.about = f"{name} on {prompt!r}"
        graph.meta["model"] = str(name)
        changes = [make(FeatureChange) for make in args.ablate + args.clamp + args.steer]
        if changes:
            stages.start("the interventions")
        tested = intervene(model, prompt, transcoders, changes, freeze=args.freeze, graph=graph) if changes else None
        shown = explained = None
        if args.qk and model.config.norm_position != "post":  # a post-norm model's edges have no first moves
            stages.start("the attention")
            shown, explained = explain(args, graph, model, transcoders)
        stages.start("writing")
        written, shown, (replacement, completeness) = write_graph(args, graph, model, transcoders, tested, shown)
    if not args.quiet:
        counts = {kind: sum(node.kind == kind for node in graph.nodes) for kind in ("feature", "error", "token", "logit")}
        # a token and its probability kept on one line (a no-break space, which the folding never breaks at)
        logits = ", ".join(f"{printable(node.label)}\u00a0{node.value:.3f}" for node in graph.nodes if node.kind == "logit")
        rows = [("model", printable(str(name))), ("prompt", printable(repr(prompt))),
                ("outputs", logits),
                ("graph", f"{counts['feature']:,} features, {counts['error']} errors, {counts['token']} tokens, "
                          f"{counts['logit']} logits"),
                ("memory", graph.meta["memory"]),
                ("check", graph.check), *([("logits", graph.meta["logits"])] if "logits" in graph.meta else []),
                ("scores", f"replacement {replacement:.3f}, completeness {completeness:.3f}")]
        if shown is not None:
            rows.append(("pruned", f"node threshold {args.node_threshold}, edge threshold {args.edge_threshold}: "
                                   f"{shown.check}"))
        if args.qk and explained is None:
            rows.append(("attention", "not split by head: a post-norm model's edges cross a norm after every "
                                      "sublayer, so no path has a first move (anatomy.circuits.qk_attribution "
                                      "still explains a head's score)"))
        if explained is not None:
            record = graph.meta["attention"]
            rows.append(("attention", f"{len(record['edges'])} edges across positions split by head, "
                                      f"{len(record['qk'])} heads' scores split into pairs of nodes; {record['check']}"))
        rows.append(("time", stages.times()))
        rows += [("written", printable(str(path))) for path in written]
        print(summary_block("anatomy circuits", rows))
        if tested is not None:
            print(intervention_table(tested))
    return 0


def mlp_out_normed(name) -> bool:
    """Whether the model `name` normalises its MLP's output (read from its config, no tensor): circuit-tracer's
    hook_mlp_out is then that norm's output."""
    from ..checkpoints.describe import config_of
    from .replacement import block_norms

    config = config_of(name) if name else None
    return config is not None and block_norms(config)["mlp_output"] is not None


def explain(args, graph, model, transcoders):
    """(the pruned graph, its explain_attention edges): the --qk strongest edges across positions of the pruned graph
    explained, the record in both graphs' meta (the whole one's file keeps it too)."""
    from .attention_edges import explain_attention
    from .prune import pruned

    shown = pruned(graph, args.node_threshold, args.edge_threshold)
    edges = explain_attention(model, transcoders, shown, n=args.qk)
    graph.meta["attention"] = shown.meta["attention"]
    return shown, edges


def write_graph(args, graph, model, transcoders, tested, shown=None):
    """Write the graph to every --out (pruned for the page and the JSON, whole to .safetensors; shown: the pruned
    graph if made already); returns (the paths written, the pruned graph or None, (replacement, completeness))."""
    from .prune import pruned, scores
    from .save import save

    replacement, completeness = scores(graph)
    graph.meta.update(replacement=replacement, completeness=completeness)
    if shown is not None:
        shown.meta.update(replacement=replacement, completeness=completeness)
    written, details = [], None
    for path in args.out:
        suffix = Path(path).suffix.lower()
        if suffix == ".safetensors":
            written.append(save(graph, path))
            continue
        shown = shown or pruned(graph, args.node_threshold, args.edge_threshold)
        details = details or feature_details(args, model, transcoders, shown)
        if suffix == ".json":
            written.append(save(shown, path, labels=details.labels))
            continue
        written.append(save(shown, path, details=details, scores=(replacement, completeness), intervention=tested))
    return written, shown, (replacement, completeness)


def feature_details(args, model, transcoders, shown):
    """What the page and the JSON say of the pruned graph's features: the tokens each promotes and suppresses,
    and with --contexts its top contexts, read within --context-seconds; a label from them."""
    from .features import context_tokens, promoted_tokens, top_contexts

    details = promoted_tokens(model, transcoders, shown)
    if args.contexts:  # read a piece at a time, up to the cap
        tokens = context_tokens(args.contexts, model.tokenizer, args.max_context_tokens)
        details = top_contexts(model, transcoders, shown, tokens, details, seconds=args.context_seconds)
        details.source = ", ".join(Path(name).name for name in args.contexts)
    return details


def intervention_table(result) -> str:
    """The target tokens' probabilities before and after, the model's change of each demeaned logit and the
    graph's two predictions, as fixed-width columns within 80."""
    lines = textwrap.wrap(f"interventions ({result.freeze} frozen): " + ", ".join(str(c) for c in result.changes), 80,
                          subsequent_indent="  ")
    if result.unseen:
        lines += textwrap.wrap("not nodes of the graph (no prediction for them): " + ", ".join(str(c) for c in result.unseen),
                               80, initial_indent="  ", subsequent_indent="  ")
    lines.append(f"  {'token':<16}{'p before':>9}{'p after':>9}{'logit change':>14}{'graph: direct':>15}{'through':>10}")
    for row in result.rows():
        token = printable(row["token"])[:15]
        lines.append(f"  {token:<16}{row['before']:>9.3f}{row['after']:>9.3f}{row['change']:>+14.3f}"
                     f"{row.get('direct', float('nan')):>+15.3f}{row.get('through', float('nan')):>+10.3f}")
    return "\n".join(lines)
