"""The probe's hostile calls (probe_circuits.py): pair files and tasks, the Python arguments of the circuits floor,
the command line's arguments, and graphs built from four threads sharing one lazily read set."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

import torch

from probe_cases_files import GRAPHS, SETS, Case, copied, fixtures

PROMPT = json.loads((GRAPHS / "README.json").read_text())["prompt"]
PAIR = {"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"}
_TOY: dict = {}


def toy():
    """A pre-norm toy with its tokenizer, and its folder (for the command line), made once a worker."""
    if not _TOY:
        import tempfile

        from anatomy.checkpoints.toys import build_toy, toy_tokenizer

        model = build_toy("toy", norm_position="pre", final_norm=True).eval()
        model.tokenizer = toy_tokenizer("toy")
        folder = Path(tempfile.mkdtemp())
        model.save_pretrained(folder)
        model.tokenizer.save(folder)
        _TOY.update(model=model, folder=str(folder))
    return _TOY["model"], _TOY["folder"]


# ---- pair files ------------------------------------------------------------------------------------------
PAIR_LINES = {
    "not json": "{clean: 1", "nested": "[" * 100_000 + "]" * 100_000, "a list": "[1, 2]", "a string": '"x"',
    "a number": "3", "null": "null", "bom": "\ufeff" + json.dumps(PAIR),
    **{f"no {key}": json.dumps({k: v for k, v in PAIR.items() if k != key}) for key in PAIR},
    **{f"{key} {v!r}"[:60]: json.dumps({**PAIR, key: v}) for key in ("clean", "corrupt") for v in (3, None, {"a": 1}, "", "   ")},
    **{f"{key} {v!r}"[:60]: json.dumps({**PAIR, key: v}) for key in ("answer", "wrong")
       for v in ([], [3], [""], "", [None], [[" is"]], [" is"] * 2000, " Hello World")},
    "answer is wrong": json.dumps({**PAIR, "wrong": PAIR["answer"]}),
    "answers overlap": json.dumps({**PAIR, "wrong": [" World", PAIR["answer"]]}),
    "clean is corrupt": json.dumps({**PAIR, "corrupt": PAIR["clean"]}),
    "unequal lengths": json.dumps({**PAIR, "corrupt": "Hello"}),
    "past the context": json.dumps({**PAIR, "clean": "Hello " * 40, "corrupt": "World " * 40}),
    "lone surrogate": json.dumps({**PAIR, "clean": "\ud800 World, this is"}),
    "2 MB line": json.dumps({**PAIR, "clean": "x" * 2_000_000}),
    "nan answer": '{"clean": "a", "corrupt": "b", "answer": NaN, "wrong": " is"}',
}


def pairs_case(lines, n: int = 100):
    def run(tmp):
        from anatomy.circuits.discovery import build_task

        path = tmp / "pairs.jsonl"
        if isinstance(lines, bytes):
            path.write_bytes(lines)
        else:
            path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        return lambda: build_task(toy()[0], str(path), n)
    return run


def pairs_file_case(kind: str):
    def run(tmp):
        from anatomy.circuits.discovery import load_pairs

        path = tmp / "pairs.jsonl"
        {"pipe": lambda: os.mkfifo(path), "folder": lambda: path.mkdir(), "missing": lambda: None,
         "to /dev/zero": lambda: path.symlink_to("/dev/zero"),
         "million blank lines": lambda: path.write_text("\n" * 1_000_000)}[kind]()
        return lambda: load_pairs(toy()[0], path)
    return run


def task_call_case(call):
    def run(tmp):
        from anatomy.circuits import discovery

        return lambda: call(discovery, toy()[0])
    return run


TASK_CALLS = {
    "ioi n 1e9": lambda d, m: d.ioi(m, 10**9), "ioi n 0": lambda d, m: d.ioi(m, 0), "ioi n 2.0": lambda d, m: d.ioi(m, 2.0),
    "ioi seed None": lambda d, m: d.ioi(m, 5, seed=None), "ioi seed -1": lambda d, m: d.ioi(m, 5, seed=-1),
    "sva n True": lambda d, m: d.subject_verb(m, True), "greater-than n '5'": lambda d, m: d.greater_than(m, "5"),
    "build_task a list": lambda d, m: d.build_task(m, ["ioi"]), "build_task unknown": lambda d, m: d.build_task(m, "x" * 10**5),
    "make_task a string": lambda d, m: d.make_task(m, "t", "clean"), "make_task a list of lists": lambda d, m: d.make_task(m, "t", [[1]]),
    "make_task no pairs": lambda d, m: d.make_task(m, "t", []), "make_task metric": lambda d, m: d.make_task(m, "t", [PAIR], metric="x"),
    "make_task 100001 pairs": lambda d, m: d.make_task(m, "t", [PAIR] * 100_001),
    "load_pairs limit 0": lambda d, m: d.load_pairs(m, "x.jsonl", limit=0),
    "a model that is not one": lambda d, m: d.ioi("smollm2", 5),
}


# ---- Python arguments ------------------------------------------------------------------------------------------
def graph_call_case(call):
    def run(tmp):
        from anatomy import circuits

        model, transcoders = fixtures()
        return lambda: call(circuits, model, transcoders)
    return run


BAD_COUNTS = (0, -1, 1.5, True, "3", None, math.nan)
GRAPH_CALLS = {
    **{f"{name}={v!r}": (lambda name, v: lambda c, m, t: c.attribution_graph(m, PROMPT, t, **{name: v}))(name, v)
       for name in ("max_logits", "batch_size", "update_interval") for v in BAD_COUNTS if not (v is None and name == "x")},
    **{f"with a cap, {name}={v!r}": (lambda name, v: lambda c, m, t: c.attribution_graph(
        m, PROMPT, t, max_feature_nodes=2, **{name: v}))(name, v) for name in ("batch_size", "update_interval") for v in (0, -1)},
    **{f"max_feature_nodes={v!r}": (lambda v: lambda c, m, t: c.attribution_graph(m, PROMPT, t, max_feature_nodes=v))(v)
       for v in (0, -3, 2.5, True, "2")},
    **{f"logit_probability={v!r}": (lambda v: lambda c, m, t: c.attribution_graph(m, PROMPT, t, logit_probability=v))(v)
       for v in (0.0, 1.5, -0.1, math.nan, math.inf, "0.9", True, None)},
    **{f"max_bytes={v!r}": (lambda v: lambda c, m, t: c.attribution_graph(m, PROMPT, t, max_bytes=v))(v) for v in (0, -1, 1, 2.5)},
    "progress not callable": lambda c, m, t: c.attribution_graph(m, PROMPT, t, progress=3),
    **{f"prompt {name}": (lambda p: lambda c, m, t: c.attribution_graph(m, p, t))(p) for name, p in {
        "bytes": b"Hello", "bytearray": bytearray(b"Hi"), "floats": [1.5, 2.5], "nested": [[1, 2]], "bools": [True, False],
        "float tensor": torch.tensor([1.0, 2.0]), "bool tensor": torch.tensor([True, False]), "2-d": torch.ones(2, 3, dtype=torch.long),
        "empty list": [], "one id": [1], "past vocab": [1, 2, 500], "negative": [1, -2], "past context": [1] * 100,
        "None": None, "dict": {"a": 1}, "set": {1, 2}, "empty": "", "spaces": "   ", "surrogate": "\ud800 hi", "int": 7}.items()},
    "model a string": lambda c, m, t: c.attribution_graph("smollm2", PROMPT, t),
    "transcoders a path": lambda c, m, t: c.attribution_graph(m, PROMPT, str(SETS)),
    "a set of 2 layers": lambda c, m, t: c.attribution_graph(m, PROMPT, type(t)(list(t.layers)[:2])),
    **{f"freeze={v!r}": (lambda v: lambda c, m, t: c.intervene(m, PROMPT, t, [], freeze=v))(v) for v in ("some", ["all"], None)},
    "changes a string": lambda c, m, t: c.intervene(m, PROMPT, t, "0:1=2"),
    "changes of tuples": lambda c, m, t: c.intervene(m, PROMPT, t, [(0, 1, None, 2.0)]),
    **{f"change {kw}": (lambda kw: lambda c, m, t: c.intervene(m, PROMPT, t, [c.FeatureChange(**kw)]))(kw) for kw in (
        dict(layer=0, feature=1, value=1e308), dict(layer=0, feature=1, add=-1e308), dict(layer=0, feature=1, value=math.nan),
        dict(layer=0, feature=1, add=math.inf), dict(layer=0, feature=1, value=1.0, add=1.0), dict(layer=0, feature=1),
        dict(layer=-1, feature=1, value=0.0), dict(layer=7, feature=1, value=0.0), dict(layer=0, feature=10**6, value=0.0),
        dict(layer=0, feature=1, position=0, value=0.0), dict(layer=0, feature=1, position=99, value=0.0),
        dict(layer=True, feature=1, value=0.0), dict(layer=0, feature=1.5, value=0.0), dict(layer=0, feature=1, value="2"))},
    "graph of another prompt": lambda c, m, t: c.intervene(m, PROMPT, t, [], graph=c.attribution_graph(m, "Hello", t)),
    "graph not a graph": lambda c, m, t: c.intervene(m, PROMPT, t, [], graph={"nodes": []}),
    **{f"prune {name}={v!r}": (lambda name, v: lambda c, m, t: c.pruned(c.attribution_graph(m, PROMPT, t), **{name: v}))(name, v)
       for name in ("node_threshold", "edge_threshold") for v in (math.nan, -0.1, 1.1, "0.5", None)},
    "neuronpedia of a circuit": lambda c, m, t: c.neuronpedia_json(c.Graph([], torch.zeros(0, 0), [], 1, kind="circuit")),
    "save as .png": lambda c, m, t: c.save(c.attribution_graph(m, PROMPT, t), "g.png"),
    "a graph with a bad adjacency": lambda c, m, t: c.Graph([c.Node("token", -1, 0)], torch.zeros(2, 2), [], 1),
    "a node of a bad kind": lambda c, m, t: c.Node("neuron", 0, 0),
    "a node of a float layer": lambda c, m, t: c.Node("feature", 0.5, 0),
}


def context_case(max_tokens):
    def run(tmp):
        from anatomy.circuits.features import context_tokens

        (tmp / "c.txt").write_text("hello world")
        return lambda: context_tokens([str(tmp / "c.txt")], fixtures()[0].tokenizer, max_tokens)
    return run


# ---- the command line ------------------------------------------------------------------------------------------
def cli_case(build):
    def run(tmp):
        os.chdir(tmp)
        return [str(x) for x in build(tmp)]
    return run


def base(tmp, *extra):
    return ["circuits", PROMPT, "--model", GRAPHS / "llama", "--transcoders", GRAPHS / "plt_jumprelu",
            "--threads", "1", "--out", tmp / "g.json", *extra]


def nan_set(tmp):
    from safetensors.torch import load_file, save

    folder = copied(tmp, source=GRAPHS)
    tensors = load_file(str(folder / "layer_2.safetensors"))
    tensors["activation_function.threshold"][0] = math.nan
    (folder / "layer_2.safetensors").write_bytes(save(tensors))
    return folder


CLI = {
    **{f"--clamp {v}": (lambda v: lambda tmp: base(tmp, "--clamp", v))(v)
       for v in ("0:0=1e999", "0:0=-1e308", "0:0=nan", "0:0=inf", "0:0=1.2.3", "0:0", "x:y=1", "0:0@0=1", "9:0=1", "0:99999=1")},
    **{f"--steer {v}": (lambda v: lambda tmp: base(tmp, "--steer", v))(v) for v in ("0:0=-1e308", "0:0@1=1e39", "0:0=")},
    **{f"--ablate {v}": (lambda v: lambda tmp: base(tmp, "--ablate", v))(v) for v in ("0:0=1", "-1:0", "0:0@-1")},
    **{f"{option} {v}": (lambda option, v: lambda tmp: base(tmp, option, v))(option, v) for option, values in (
        ("--max-logits", ("0", "-1", "1.5", "nan")), ("--logit-probability", ("2", "nan", "-0.1")),
        ("--node-threshold", ("nan", "1.1")), ("--edge-threshold", ("-1",)), ("--max-feature-nodes", ("0", "1e3")),
        ("--max-context-tokens", ("0", "-5")), ("--freeze", ("some",)), ("--threads", ("0", "1000")))
       for v in values},
    "--out not UTF-8": lambda tmp: base(tmp)[:-1] + [tmp / "g\udcff.json"],
    "--out a folder": lambda tmp: base(tmp)[:-1] + [tmp], "--out .png": lambda tmp: base(tmp)[:-1] + [tmp / "g.png"],
    "--out no folder": lambda tmp: base(tmp)[:-1] + [tmp / "none" / "g.json"],
    "--transcoders missing": lambda tmp: base(tmp)[:4] + ["--transcoders", tmp / "none", "--out", tmp / "g.json"],
    "--transcoders a file": lambda tmp: base(tmp)[:4] + ["--transcoders", SETS / "plt_jumprelu" / "config.yaml", "--out", tmp / "g.json"],
    "--transcoders gemma offline": lambda tmp: (os.environ.__setitem__("HF_HUB_CACHE", str(tmp)),
                                               base(tmp)[:4] + ["--transcoders", "gemma", "--out", tmp / "g.json"])[1],
    "--transcoders of NaN": lambda tmp: base(tmp)[:4] + ["--transcoders", nan_set(tmp), "--out", tmp / "g.json"],
    "--transcoders that do not fit": lambda tmp: base(tmp)[:4] + ["--transcoders", SETS / "plt_jumprelu", "--out", tmp / "g.json"],
    "--contexts missing": lambda tmp: base(tmp)[:-1] + [tmp / "g.html", "--contexts", tmp / "none.txt"],
    "--contexts not UTF-8": lambda tmp: ((tmp / "c.txt").write_bytes(b"ok \xff\xfe"),
                                        base(tmp)[:-1] + [tmp / "g.html", "--contexts", tmp / "c.txt"])[1],
    "--contexts a folder": lambda tmp: base(tmp)[:-1] + [tmp / "g.html", "--contexts", tmp],
    "--model missing": lambda tmp: ["circuits", PROMPT, "--model", tmp / "none", "--transcoders", GRAPHS / "plt_jumprelu",
                                    "--out", tmp / "g.json"],
    "--model post-norm": lambda tmp: ["circuits", PROMPT, "--model", "toy", "--transcoders", GRAPHS / "plt_jumprelu",
                                      "--out", tmp / "g.json"],
    "prompt empty": lambda tmp: ["circuits", ""] + base(tmp)[2:], "prompt spaces": lambda tmp: ["circuits", "  "] + base(tmp)[2:],
    "prompt surrogate": lambda tmp: ["circuits", "hi \udcff"] + base(tmp)[2:],
    "prompt too long": lambda tmp: ["circuits", "Hello " * 200] + base(tmp)[2:],
    **{f"discover {name}": (lambda build: lambda tmp: ["circuits", "discover", "--model", toy()[1], "--steps", "1", *build(tmp)])(build)
       for name, build in {
           "--task missing": lambda tmp: ["--task", tmp / "none.jsonl"], "--task a folder": lambda tmp: ["--task", tmp],
           "--task unknown": lambda tmp: ["--task", "iio"],
           "--task answer is wrong": lambda tmp: ((tmp / "p.jsonl").write_text(json.dumps({**PAIR, "wrong": PAIR["answer"]})),
                                                  ["--task", tmp / "p.jsonl"])[1],
           "--task nested": lambda tmp: ((tmp / "p.jsonl").write_text("[" * 100_000), ["--task", tmp / "p.jsonl"])[1],
           "--task none right": lambda tmp: ((tmp / "p.jsonl").write_text(json.dumps(
               {**PAIR, "answer": PAIR["wrong"], "wrong": PAIR["answer"]})), ["--task", tmp / "p.jsonl"])[1],
           **{f"{o} {v}": (lambda o, v: lambda tmp: ["--task", "ioi", o, v])(o, v) for o, values in (
               ("--pairs", ("0", "1e9", "100001")), ("--steps", ("0", "257")), ("--edges", ("0",)), ("--verify", ("-1",)),
               ("--target", ("nan", "1.5")), ("--seed", ("-1",)), ("--method", ("eap-x",)), ("--out", ("c.json",)))
              for v in values}}.items()},
    "discover post-norm model": lambda tmp: ["circuits", "discover", "--task", "ioi", "--model", "toy"],
}


def threads_case(tmp):
    return four_threads


def four_threads():
    """Four threads building graphs on one lazily read set equal a graph built alone, bit for bit."""
    from anatomy.circuits import attribution_graph
    from anatomy.sae import load_transcoders

    model = fixtures()[0]
    alone = attribution_graph(model, PROMPT, load_transcoders(GRAPHS / "plt_jumprelu"))
    shared = load_transcoders(GRAPHS / "plt_jumprelu", resident=1)  # layers let go and built again, in turn
    built = [None] * 4

    def build(i):
        built[i] = attribution_graph(model, PROMPT, shared)
    workers = [threading.Thread(target=build, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(g is not None and torch.equal(g.adjacency, alone.adjacency) and g.nodes == alone.nodes for g in built)


def call_cases() -> list[Case]:
    cases = [Case(f"pairs {name}", "pair files", pairs_case([json.dumps(PAIR), line])) for name, line in PAIR_LINES.items()]
    cases += [Case("pairs not UTF-8", "pair files", pairs_case(b'{"clean": "caf\xe9"}\n')),
              Case("pairs a bad pair, then garbage", "pair files", pairs_case(
                  [json.dumps({**PAIR, "wrong": PAIR["answer"]})] + ["{garbage"] * 10, 2))]
    cases += [Case(f"pairs {kind}", "pair files", pairs_file_case(kind))
              for kind in ("pipe", "folder", "missing", "to /dev/zero", "million blank lines")]
    cases += [Case(name, "pair files", task_call_case(call)) for name, call in TASK_CALLS.items()]
    cases += [Case(name, "python arguments", graph_call_case(call)) for name, call in GRAPH_CALLS.items()]
    cases += [Case(f"context_tokens max_tokens={v!r}", "python arguments", context_case(v)) for v in (0, -1, 1.5, None)]
    cases += [Case(name, "command line", cli_case(build), cli=True) for name, build in CLI.items()]
    cases += [Case(f"four threads, one lazy set ({i})", "threads", threads_case, expect="held") for i in range(3)]
    return cases
