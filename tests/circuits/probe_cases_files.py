"""The probe's hostile files (probe_circuits.py): transcoder sets in every layout, offline names, graph files.
Each case makes its files in a fresh folder and calls the floor the way a user would; reading every layer
(a lazy set reads its weights when they are used)."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save

HERE = Path(__file__).parent
GRAPHS = HERE / "fixtures" / "graphs"
SETS = HERE.parent / "sae" / "fixtures" / "circuit_tracer"
HOOKS = "model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"
PWN = "touch pwned"  # a payload's command: the marker file appears if it ever runs (cases run in their folder)


@dataclass(frozen=True)
class Case:
    """One probe: run(tmp) makes its files under tmp and calls the floor (or returns argv, for the command line)."""

    name: str
    group: str
    run: Callable[[Path], object]
    cli: bool = False
    expect: str = "refused"


_FIXTURES: dict = {}


def fixtures():
    """(the fixture Llama, its transcoder set), loaded once a worker."""
    if not _FIXTURES:
        import anatomy
        from anatomy.sae import load_transcoders

        _FIXTURES["model"] = anatomy.from_pretrained(GRAPHS / "llama").eval()
        _FIXTURES["transcoders"] = load_transcoders(GRAPHS / "plt_jumprelu")
    return _FIXTURES["model"], _FIXTURES["transcoders"]


def base_graph() -> Path:
    """A graph of the fixture's prompt, saved once a worker (the graph files' cases change copies of it)."""
    if "graph" not in _FIXTURES:
        import tempfile

        from anatomy.circuits import attribution_graph, save

        model, transcoders = fixtures()
        prompt = json.loads((GRAPHS / "README.json").read_text())["prompt"]
        _FIXTURES["graph"] = Path(tempfile.mkdtemp()) / "g.safetensors"
        save(attribution_graph(model, prompt, transcoders), _FIXTURES["graph"])
    return _FIXTURES["graph"]


def read_all(source, **options):
    """load_transcoders, then every layer read, as a graph would read them."""
    from anatomy.sae import load_transcoders

    transcoders = load_transcoders(source, **options)
    for layer in range(transcoders.n_layers):
        transcoders.layers[layer]
    return transcoders


def copied(tmp: Path, name: str = "plt_jumprelu", source: Path = SETS) -> Path:
    shutil.copytree(source / name, tmp / name)
    os.chdir(tmp)  # a payload that runs writes its marker here
    return tmp / name


# ---- config.yaml -----------------------------------------------------------------------------------------
CONFIG_TEXTS = {
    **{f"model_kind {v}": f"model_kind: {v}\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"
       for v in ["[]", "{}", "3", "3.5", "null", "true", "''", "sae", "TRANSCODER_SET", "'transcoder_set '",
                 "[transcoder_set]", "{transcoder_set: 1}", "x" * 100_000]},
    **{f"{key} {v}": HOOKS.replace(f"{key}: {hook}", f"{key}: {v}")
       for key, hook in (("feature_input_hook", "mlp.hook_in"), ("feature_output_hook", "mlp.hook_out"))
       for v in ["[]", "{}", "3", "null", "''", "hook_embed", "blocks.0.mlp.hook_in", "mlp.hook_in.x",
                 "'" + "a" * 5000 + "'", "attn.hook_z", "'mlp.hook_in; rm -rf /'"]},
    **{f"transcoders {v[:40]}": HOOKS + f"transcoders: {v}\n"
       for v in ["''", "[]", "{}", "3", "[3]", "[null]", "[[layer_0.safetensors]]", "['../x.safetensors']",
                 "['/etc/passwd']", "['layer_0.safetensors', 'layer_0.safetensors']",
                 "['layer_0.safetensors', './layer_0.safetensors', 'layer_2.safetensors']",
                 "['http://example.com/layer_0.safetensors']", "['hf://']", "['hf://a']", "['hf://a/b']",
                 "['hf://a/b/../../../etc/passwd']", "['hf://a/b/c.safetensors?revision=../../x']",
                 "['missing.safetensors']", "['config.yaml']", "['.']", "['layer_0.safetensors', 'nope/']",
                 "[" + ", ".join(["l"] * 45_000) + "]", "['" + "a" * 10_000 + "']"]},
    "empty": "", "a list": "- a\n- b\n", "null": "null\n", "a number": "3\n", "not yaml": "model_kind: [unclosed\n",
    "tabs": "model_kind:\ttranscoder_set\n\tfeature_input_hook: x\n",
    "python tag apply": f"!!python/object/apply:os.system ['{PWN}']\n",
    "python tag new": HOOKS + f"scan: !!python/object/new:os.system ['{PWN}']\n",
    "python name": HOOKS + "scan: !!python/name:os.system\n",
    "alias laughs": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
                                                       for i in range(9)) + HOOKS.replace("mlp.hook_in", "*j"),
    "alias hook": "x: &h mlp.hook_in\n" + HOOKS.replace("feature_input_hook: mlp.hook_in", "feature_input_hook: *h"),
    "deep": HOOKS + "scan: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "deep map": HOOKS + "scan: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "huge int": HOOKS + "scan: 1" + "0" * 10_000 + "\n",
    "big": HOOKS + "scan: " + "x" * 2_000_000 + "\n",
}


def config_case(text: str):
    def run(tmp):
        folder = copied(tmp)
        (folder / "config.yaml").write_text(text, encoding="utf-8")
        return lambda: read_all(folder)
    return run


def config_file_case(kind: str):
    def run(tmp):
        folder = copied(tmp)
        (folder / "config.yaml").unlink()
        if kind == "binary":
            (folder / "config.yaml").write_bytes(bytes(range(256)) * 10)
        elif kind == "latin-1":
            (folder / "config.yaml").write_bytes(HOOKS.encode() + b"scan: caf\xe9\n")
        elif kind == "pipe":
            os.mkfifo(folder / "config.yaml")
        elif kind == "folder":
            (folder / "config.yaml").mkdir()
            (folder / "transcoders").mkdir()
        else:
            (folder / "config.yaml").symlink_to(kind)
        return lambda: read_all(folder)
    return run


# ---- layer files -------------------------------------------------------------------------------------------
TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "activation_function.threshold")


def tensor_case(name: str, change: str):
    def run(tmp):
        folder = copied(tmp)
        tensors = load_file(str(folder / "layer_1.safetensors"))
        t = tensors[name]
        if change == "drop":
            del tensors[name]
        elif change == "grow":
            tensors[name] = torch.zeros(*[d + 1 for d in t.shape])
        elif change == "rank":
            tensors[name] = t.reshape(-1, 1)
        elif change in ("int32", "bool", "uint8"):
            tensors[name] = t.to(getattr(torch, change))
        else:
            t.view(-1)[t.numel() // 2] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[change]
        (folder / "layer_1.safetensors").write_bytes(save(tensors))
        return lambda: read_all(folder)
    return run


def header(entries: dict, data: bytes = b"", raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text + data


def F32(shape, begin=0):
    size = int(np.prod(shape)) * 4
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, begin + size]}


LAYER_FILES = {
    "empty": lambda f: f.write_bytes(b""), "four bytes": lambda f: f.write_bytes(b"abcd"),
    "zeros": lambda f: f.write_bytes(b"\0" * 4096), "random": lambda f: f.write_bytes(os.urandom(4096)),
    "header length huge": lambda f: f.write_bytes(struct.pack("<Q", 2**60) + b"{}"),
    "header length 100 MB": lambda f: f.write_bytes(struct.pack("<Q", 100_000_000) + b"{}"),
    "header not json": lambda f: f.write_bytes(header({}, raw=b"{not json}")),
    "header a list": lambda f: f.write_bytes(header({}, raw=b"[1, 2]")),
    "header key twice": lambda f: f.write_bytes(header({}, raw=b'{"W_enc": ' + json.dumps(F32((40, 32))).encode()
                                                        + b', "W_enc": ' + json.dumps(F32((40, 32))).encode() + b"}",
                                                        data=b"\0" * 5120)),
    "dtype unknown": lambda f: f.write_bytes(header({"W_enc": {**F32((2,)), "dtype": "F8_E4M3"}}, b"\0" * 8)),
    "offsets reversed": lambda f: f.write_bytes(header({"W_enc": {**F32((2,)), "data_offsets": [8, 0]}}, b"\0" * 8)),
    "offsets outside": lambda f: f.write_bytes(header({"W_enc": F32((1000, 1000))}, b"\0" * 8)),
    "shape negative": lambda f: f.write_bytes(header({"W_enc": {**F32((2,)), "shape": [-2]}}, b"\0" * 8)),
    "shape 1e12": lambda f: f.write_bytes(header({"W_enc": {**F32((2,)), "shape": [10**6, 10**6]}}, b"\0" * 8)),
    "metadata not text": lambda f: f.write_bytes(header({"__metadata__": {"a": 1}, "W_enc": F32((2,))}, b"\0" * 8)),
    "200000 tensors": lambda f: f.write_bytes(header({f"t{i}": F32((0,)) for i in range(200_000)})),
    "truncated": lambda f: f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2]),
    "a folder": lambda f: (f.unlink(), f.mkdir()), "a pipe": lambda f: (f.unlink(), os.mkfifo(f)),
    "to /dev/zero": lambda f: (f.unlink(), f.symlink_to("/dev/zero")),
    "outside": lambda f: (shutil.copy(f, f.parent.parent / "outside.safetensors"), f.unlink(),
                          f.symlink_to(f.parent.parent / "outside.safetensors")),
    "extra tensor": lambda f: f.write_bytes(save({**load_file(str(f)), "extra": torch.zeros(3)})),
    "skip in one layer": lambda f: f.write_bytes(save({**load_file(str(f)), "W_skip": torch.zeros(32, 32)})),
    "sparse 3 GiB": lambda f: sparse(f, (24_000, 32_000)),
}


def sparse(path: Path, shape) -> None:
    with open(path, "wb") as file:
        file.write(header({"W_enc": F32(shape)}))
        file.truncate(file.tell() + int(np.prod(shape)) * 4)


def layer_file_case(change):
    def run(tmp):
        folder = copied(tmp, source=GRAPHS)
        change(folder / "layer_1.safetensors")
        return lambda: read_all(folder)
    return run


def numbering_case(kind: str):
    def run(tmp):
        folder = copied(tmp, source=GRAPHS)
        one = folder / "layer_1.safetensors"
        if kind == "layer 99999999999":
            shutil.copy(one, folder / "layer_99999999999.safetensors")
        elif kind == "a gap":
            shutil.copy(one, folder / "layer_5.safetensors")
        elif kind == "layer_01 and layer_1":
            shutil.copy(one, folder / "layer_01.safetensors")
        elif kind == "3000 files":
            for i in range(3, 3000):
                os.link(one, folder / f"layer_{i}.safetensors")
        elif kind == "no layer_0":
            (folder / "layer_0.safetensors").unlink()
        elif kind == "no files":
            for path in folder.glob("layer_*"):
                path.unlink()
        return lambda: read_all(folder)
    return run


def clt_case(kind: str):
    def run(tmp):
        folder = copied(tmp, "clt_jumprelu")
        if kind == "decoder depth":
            (folder / "W_dec_1.safetensors").write_bytes(save({"W_dec_1": torch.zeros(40, 3, 16)}))
        elif kind == "decoder missing":
            (folder / "W_dec_1.safetensors").unlink()
        elif kind == "extra decoder":
            shutil.copy(folder / "W_dec_2.safetensors", folder / "W_dec_5.safetensors")
        elif kind == "threshold in one layer":
            tensors = load_file(str(folder / "W_enc_1.safetensors"))
            tensors.pop("threshold_1", None) if "threshold_1" in tensors else tensors.update(threshold_1=torch.zeros(40))
            (folder / "W_enc_1.safetensors").write_bytes(save(tensors))
        else:  # a value that is not finite in one tensor
            file, name = kind.split(":")
            tensors = load_file(str(folder / file))
            tensors[name].view(-1)[0] = math.nan
            (folder / file).write_bytes(save(tensors))
        return lambda: read_all(folder)
    return run


def file_cases() -> list[Case]:
    from probe_cases_more import more_file_cases

    cases = [Case(name, "transcoder files", config_case(text)) for name, text in CONFIG_TEXTS.items()]
    cases += [Case(f"config.yaml {kind}", "transcoder files", config_file_case(kind))
              for kind in ("binary", "latin-1", "pipe", "folder", "/dev/zero", "/proc/self/pagemap", "/etc/passwd")]
    cases += [Case(f"{name} {change}", "transcoder files", tensor_case(name, change)) for name in TENSORS
              for change in ("drop", "grow", "rank", "int32", "bool", "uint8", "nan", "inf", "-inf")]
    cases += [Case(f"layer file {name}", "transcoder files", layer_file_case(change)) for name, change in LAYER_FILES.items()]
    cases += [Case(f"numbering {kind}", "transcoder files", numbering_case(kind))
              for kind in ("layer 99999999999", "a gap", "layer_01 and layer_1", "3000 files", "no layer_0", "no files")]
    cases += [Case(f"clt {kind}", "transcoder files", clt_case(kind))
              for kind in ("decoder depth", "decoder missing", "extra decoder", "threshold in one layer",
                           "W_dec_1.safetensors:W_dec_1", "W_enc_2.safetensors:b_dec_2", "W_enc_0.safetensors:W_enc_0")]
    return cases + more_file_cases()
