"""The probe's hostile files, continued: Gemma Scope's npz, Gemma Scope 2 folders, names on the Hub (offline),
load_transcoders' arguments, and graph files (load_graph)."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save

from probe_cases_files import HOOKS, PWN, SETS, Case, base_graph, copied, read_all

sys.path.insert(0, str(Path(__file__).parent.parent / "sae"))
from transcoder_cases import arrays, fake_repo, params_npz  # noqa: E402


class Payload:
    """A pickle that runs a command when it is loaded."""

    def __reduce__(self):
        return os.system, (PWN,)


def npy(array, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def zipped(members, method=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def good(layer: int = 0) -> dict:
    return arrays(8, 16, seed=layer)


NPZ = {
    "object member": lambda: zipped([(f"{k}.npy", npy(v)) for k, v in good().items() if k != "W_enc"]
                                     + [("W_enc.npy", npy(np.array([Payload()], dtype=object), True))]),
    "pickle member": lambda: zipped([("W_enc.npy", pickle.dumps(Payload()))]),
    "member twice": lambda: zipped([("W_enc.npy", npy(good()["W_enc"]))] * 2 + [(f"{k}.npy", npy(v)) for k, v in good().items()]),
    "100 members": lambda: zipped([(f"m{i}.npy", npy(np.zeros(1, np.float32))) for i in range(100)]),
    "int weights": lambda: params_npz({**good(), "W_enc": good()["W_enc"].astype(np.int32)}),
    "bool weights": lambda: params_npz({**good(), "b_enc": good()["b_enc"] > 0}),
    "complex weights": lambda: params_npz({**good(), "b_dec": good()["b_dec"].astype(np.complex64)}),
    "structured": lambda: params_npz({**good(), "b_enc": np.zeros(16, dtype=[("a", "f4"), ("b", "f4")])}),
    "header garbage": lambda: zipped([("W_enc.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': <garbage\n")]),
    "header huge shape": lambda: zipped([("W_enc.npy", npy(np.zeros(4, np.float32)).replace(b"(4,)", b"(4000000000,)"))]),
    "header code": lambda: zipped([("W_enc.npy", b"\x93NUMPY\x01\x00\x46\x00{'descr': __import__('os').system('touch pwned'), "
                                                 b"'fortran_order': False, 'shape': (1,), }   \n")]),
    "zip bomb": lambda: params_npz({**good(), "W_enc": np.zeros((2048, 2048), np.float32)}, compressed=True),
    "bzip2": lambda: zipped([(f"{k}.npy", npy(v)) for k, v in good().items()], zipfile.ZIP_BZIP2),
    "truncated": lambda: params_npz(good())[:300],
    "not a zip": lambda: b"PK\x03\x04" + os.urandom(2000),
    "empty": lambda: b"",
    "nan weight": lambda: params_npz({**good(), "W_dec": np.full((16, 8), np.nan, np.float32)}),
    "inf threshold": lambda: params_npz({**good(), "threshold": np.full(16, np.inf, np.float32)}),
    "no threshold": lambda: params_npz({k: v for k, v in good().items() if k != "threshold"}),
    "extra array": lambda: params_npz({**good(), "extra": np.zeros(3, np.float32)}),
    "W_dec wrong shape": lambda: params_npz({**good(), "W_dec": np.zeros((16, 9), np.float32)}),
    "skip wrong shape": lambda: params_npz({**good(), "affine_skip_connection": np.zeros((8, 9), np.float32)}),
    "path in name": lambda: zipped([(f"../{k}.npy", npy(v)) for k, v in good().items()]),
    "no npy members": lambda: zipped([("readme.txt", b"hello")]),
    "both spellings": lambda: params_npz({**good(), "w_enc": good()["W_enc"]}),
}


def npz_case(make):
    def run(tmp):
        os.chdir(tmp)
        folder = tmp / "set"
        folder.mkdir()
        (folder / "config.yaml").write_text(HOOKS + "transcoders: [l0.npz, l1.npz]\n")
        (folder / "l0.npz").write_bytes(params_npz(good()))
        (folder / "l1.npz").write_bytes(make())
        return lambda: read_all(folder)
    return run


def gemma_scope_2_case(kind: str):
    def run(tmp):
        root = copied(tmp, "gemma-scope-2-tiny-pt") / "transcoder_all"
        layer = next(root.glob("layer_1_*"))
        params = layer / "params.safetensors"
        with safe_open(str(params), "pt") as handle:
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        variant = {"no variant": None}.get(kind, layer.name.split("_", 2)[2])
        if kind == "no variant":
            shutil.copytree(layer, root / "layer_0_width_1m_l0_big")
        elif kind == "unknown variant":
            variant = "width_1m"
        elif kind == "layer 99999999999":
            shutil.copytree(layer, root / layer.name.replace("layer_1_", "layer_99999999999_"))
        elif kind == "layer gap":
            shutil.copytree(layer, root / layer.name.replace("layer_1_", "layer_4_"))
        elif kind.startswith("config "):
            text = {"config not json": "{not json", "config deep": "[" * 100_000,
                    "config bad point": '{"hf_hook_point_in": "model.layers.0.self_attn.output"}',
                    "config list": "[1, 2]"}[kind]
            (next(root.glob("layer_0_*")) / "config.json").write_text(text)
        elif kind == "w_dec 4-d":
            tensors["w_dec"] = tensors["w_dec"][..., None]
        elif kind == "affine in one layer":
            tensors.pop("affine_skip_connection")
        elif kind == "nan encoder":
            tensors["w_enc"][0, 0] = math.nan
        elif kind == "missing b_enc":
            tensors.pop("b_enc")
        params.write_bytes(save(tensors))
        return lambda: read_all(root, variant=variant)
    return run


def hub_case(source: str, fill: str = "", **options):
    def run(tmp):
        os.chdir(tmp)
        os.environ["HF_HUB_CACHE"] = str(tmp / "hub")
        layers = [arrays(8, 16, seed=i) for i in range(2)]
        files = [f"layer_{i}/width_16k/average_l0_{i}/params.npz" for i in range(2)]
        if fill in ("gemma config", "gemma partial"):
            fake_repo(tmp / "hub", "mwhanna/gemma-scope-transcoders", {"config.yaml": (HOOKS + "transcoders:\n" + "".join(
                f"  - hf://google/gemma-scope-2b-pt-transcoders/{f}\n" for f in files)).encode()})
        if fill == "gemma partial":
            fake_repo(tmp / "hub", "google/gemma-scope-2b-pt-transcoders", {files[0]: params_npz(layers[0])})
        if fill == "models":
            fake_repo(tmp / "hub", "someone/models", {"config.json": b"{}", "model.safetensors": b"x"})
        if fill == "two variants":
            fake_repo(tmp / "hub", "google/gemma-scope-2-tiny", {
                f"transcoder_all/layer_{i}_{v}/params.safetensors": b"x" for i in range(2) for v in ("a", "b")})
        if fill == "escaping link":
            snapshot = fake_repo(tmp / "hub", "someone/set", {"config.yaml": (HOOKS + "transcoders: [l0.safetensors]\n").encode()})
            shutil.copy(SETS / "plt_jumprelu" / "layer_0.safetensors", tmp / "outside.safetensors")
            (snapshot / "l0.safetensors").symlink_to(tmp / "outside.safetensors")
        def call():
            try:
                read_all(source, **options)
            finally:
                os.environ.pop("HF_HUB_CACHE", None)
        return call
    return run


HUB = [("gemma", ""), ("llama", ""), ("org/name", ""), ("org/name@v2", ""), ("org/name/sub/folder", ""),
       ("gemma", "gemma config"), ("gemma", "gemma partial"), ("someone/models", "models"),
       ("google/gemma-scope-2-tiny", "two variants"), ("someone/set", "escaping link"),
       ("org/name/../../etc", ""), ("https://huggingface.co/org/name", ""), ("hf://org/name/x.safetensors", ""),
       ("a/b/c/d/e/f/g/h/i/j/k", ""), ("org/name@;rm -rf", ""), ("~/no/such/folder", ""), ("org//name", ""),
       ("-org/name", ""), ("org/" + "n" * 500, ""), ("gemma\0", "")]

ARGUMENTS = [dict(source=3), dict(source=None), dict(source=""), dict(source=["a"]), dict(dtype="float32"),
             dict(dtype=torch.int8), dict(dtype=None), dict(variant=["a"]), dict(variant=""), dict(variant="x" * 1000),
             dict(revision=3), dict(resident=0), dict(resident=-1), dict(resident=1.5), dict(resident=True),
             dict(mlp_out_norm="yes"), dict(mlp_out_norm=None)]


def argument_case(options: dict):
    def run(tmp):
        return lambda: read_all(**{"source": SETS / "plt_jumprelu", **options})
    return run


# ---- graph files -------------------------------------------------------------------------------------------
def graph_case(change):
    def run(tmp):
        from anatomy.circuits import load_graph

        with safe_open(str(base_graph()), "pt") as handle:
            tensors, meta = {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata())
        path = tmp / "g.safetensors"
        made = change(tensors, meta, path)
        if made is None:
            path.write_bytes(save(tensors, metadata=meta))
        return lambda: load_graph(path)
    return run


N = 197  # the nodes of the fixture's graph


def _set(name, value):
    return lambda t, m, p: t.__setitem__(name, value)


def _meta(key, value):
    return lambda t, m, p: m.__setitem__(key, value) if value is not None else m.pop(key)


GRAPH_CHANGES = {
    **{f"{name} dropped": (lambda name: lambda t, m, p: t.pop(name))(name)
       for name in ("adjacency", "output_weights", "kind", "layer", "column", "index", "value")},
    **{f"{name} as int32": (lambda name: lambda t, m, p: t.__setitem__(name, t[name].to(torch.int32)))(name)
       for name in ("adjacency", "kind", "value", "values")},
    **{f"{name} one longer": (lambda name: lambda t, m, p: t.__setitem__(name, torch.cat([t[name], t[name][:1]])))(name)
       for name in ("output_weights", "kind", "value", "unexplained")},
    **{f"{name} {v}": (lambda name, v: lambda t, m, p: t[name].view(-1).__setitem__(5, v))(name, v)
       for name in ("adjacency", "output_weights", "unexplained") for v in (math.nan, math.inf, -math.inf)},
    "value inf": lambda t, m, p: t["value"].__setitem__(3, math.inf),
    **{f"{name} {v}": (lambda name, v: lambda t, m, p: t[name].__setitem__(4, v))(name, v)
       for name, values in (("kind", (-1, 8, 2**40)), ("layer", (-5, 10**9)), ("column", (-1, 10**9)), ("index", (-2, 2**50)))
       for v in values},
    "extra tensor": _set("extra", torch.zeros(2)), "adjacency 1-d": _set("adjacency", torch.zeros(N * N)),
    "a backward edge": lambda t, m, p: t["adjacency"].__setitem__((3, 150), 1.0),
    "a node twice": lambda t, m, p: [t[k].__setitem__(5, t[k][6]) for k in ("kind", "layer", "column", "index")],
    **{f"meta {k} {(v or 'dropped')[:30]}": _meta(k, v) for k, v in [
        ("format", None), ("format", "anatomy graph 2"), ("labels", None), ("labels", "[1]"), ("labels", "{}"),
        ("labels", "[" * 100_000), ("labels", json.dumps(["\udcff"] * N)), ("labels", json.dumps([3] * N)),
        ("ports", json.dumps(["x"] * N)), ("ports", json.dumps([None] * N)), ("columns", "3"), ("columns", "[1, 2]"),
        ("meta", "[]"), ("meta", "{" * 100_000), ("meta", '{"influence": "high"}'), ("meta", '{"influence": [1]}'),
        ("meta", '{"prompt_texts": [1]}'), ("meta", '{"pruned": "yes"}'), ("meta", '{"node_threshold": "x"}'),
        ("meta", "not json"), ("n_layers", "many"), ("n_layers", "-3"), ("n_layers", "1" + "0" * 30), ("error", "inf"),
        ("error", "-1"), ("error", "abc"), ("kind", "spaghetti"), ("about", None), ("check", None), ("kind", None)]},
    **{name: (lambda make: lambda t, m, p: (make(t, m, p), True)[1])(make) for name, make in {  # the file made here
        "empty file": lambda t, m, p: p.write_bytes(b""), "random": lambda t, m, p: p.write_bytes(os.urandom(5000)),
        "truncated": lambda t, m, p: p.write_bytes(save(t, metadata=m)[:3000]),
        "a folder": lambda t, m, p: p.mkdir(), "a pipe": lambda t, m, p: os.mkfifo(p),
        "to /dev/zero": lambda t, m, p: p.symlink_to("/dev/zero"), "missing": lambda t, m, p: None,
        "a transcoder file": lambda t, m, p: shutil.copy(SETS / "plt_jumprelu" / "layer_0.safetensors", p),
        "sparse 40 GB": lambda t, m, p: sparse_graph(p, m, 100_000)}.items()},
}


def sparse_graph(path: Path, meta: dict, n: int) -> None:
    """A graph file of n nodes whose header is whole and whose data is a hole."""
    layout = {"adjacency": ("F32", [n, n]), "output_weights": ("F32", [n]), "value": ("F64", [n]),
              **{name: ("I64", [n]) for name in ("kind", "layer", "column", "index")}}
    entries, offset = {"__metadata__": meta}, 0
    for name, (dtype, shape) in layout.items():
        size = int(np.prod(shape)) * (8 if dtype != "F32" else 4)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(entries).encode()
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)


def more_file_cases() -> list[Case]:
    cases = [Case(f"npz {name}", "transcoder files", npz_case(make)) for name, make in NPZ.items()]
    cases += [Case(f"gemma scope 2 {kind}", "transcoder files", gemma_scope_2_case(kind))
              for kind in ("no variant", "unknown variant", "layer 99999999999", "layer gap", "config not json",
                           "config deep", "config bad point", "config list", "w_dec 4-d", "affine in one layer",
                           "nan encoder", "missing b_enc")]
    cases += [Case(f"hub {source!r} {fill}".strip(), "names offline", hub_case(source, fill)) for source, fill in HUB]
    cases += [Case(f"argument {options}"[:80], "transcoder arguments", argument_case(options)) for options in ARGUMENTS]
    cases += [Case(name, "graph files", graph_case(change)) for name, change in GRAPH_CHANGES.items()]
    return cases
