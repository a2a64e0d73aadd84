"""Hostile inputs of the circuits floor (issue 40), each refused before work in one ValueError, or on the command
line in one line with exit status 2: arguments that would hang or overflow, prompts of ids that are not ids,
feature changes past float32, graph files that are not graphs, listings that cannot be read, texts and pair
files read only as far as their caps. Every file is made here, small."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

import anatomy
from anatomy.circuits import FeatureChange, attribution_graph, intervene, load_graph, save as save_graph
from anatomy.cli import main
from anatomy.sae import load_transcoders
from cli_status import status

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
PROMPT = json.loads((FIXTURES / "README.json").read_text())["prompt"]
BASE = ["circuits", PROMPT, "--model", str(FIXTURES / "llama"), "--transcoders", str(FIXTURES / "plt_jumprelu"),
        "--threads", "1"]


@pytest.fixture(scope="module")
def llama():
    return anatomy.from_pretrained(FIXTURES / "llama").eval(), load_transcoders(FIXTURES / "plt_jumprelu")


def one_line(capsys, *words):
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "internal error" not in error, error
    assert all(word in error for word in words), error
    return error


# ---- Python arguments -----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("options, words", [
    (dict(max_feature_nodes=3, update_interval=0), "update_interval must be an integer from 1"),
    (dict(max_feature_nodes=3, batch_size=-1), "batch_size must be an integer from 1"),
    (dict(logit_probability=float("nan")), "logit_probability must be a finite number in (0.0, 1.0]"),
    (dict(logit_probability="0.5"), "logit_probability"), (dict(max_logits=2.0), "max_logits"),
    (dict(max_bytes=True), "max_bytes"), (dict(progress="yes"), "progress must be a function"),
])
def test_an_argument_that_would_hang_or_mislead_is_refused(llama, options, words):
    model, transcoders = llama
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
        attribution_graph(model, PROMPT, transcoders, **options)


@pytest.mark.parametrize("prompt, words", [
    (b"The capital", "must be a text"), ([1.7, 2.2, 3.9], "item 0 is 1.7"), (torch.tensor([1.0, 2.0]), "tensor of torch.float32"),
    ([[1, 2, 3]], "item 0 is [1, 2, 3]"), ([True, 2, 3], "item 0 is True"), (torch.ones(2, 3, dtype=torch.long), "shape (2, 3)"),
    ({"ids": [1, 2]}, "got dict"), ([1, 2, 99], "token ids must be in [0, 23)"),
])
def test_a_prompt_of_ids_that_are_not_ids_is_refused(llama, prompt, words):
    model, transcoders = llama
    with pytest.raises(ValueError) as error:
        attribution_graph(model, prompt, transcoders)
    assert words in str(error.value)


def test_the_model_and_the_set_are_checked_for_what_they_are(llama):
    model, transcoders = llama
    with pytest.raises(ValueError, match="transcoders must be a TranscoderSet"):
        attribution_graph(model, PROMPT, "runs/transcoders")
    with pytest.raises(ValueError, match="model must be an anatomy model"):
        attribution_graph("smollm2", PROMPT, transcoders)


@pytest.mark.parametrize("change, words", [
    (dict(value=1e308), "value must be a finite number in [-1000000.0, 1000000.0]"),
    (dict(add=float("inf")), "add must be a finite number"), (dict(value=float("nan")), "value must be"),
    (dict(value=1.0, layer=-1), "layer must be an integer from 0"), (dict(value=1.0, feature=2.5), "feature must be"),
    (dict(value=1.0, position=True), "position must be"),
])
def test_a_feature_change_past_float32_or_of_the_wrong_type_is_refused(change, words):
    arguments = {"layer": 0, "feature": 1, **change}
    with pytest.raises(ValueError) as error:
        FeatureChange(**arguments)
    assert words in str(error.value)


def test_interventions_are_checked_for_what_they_are(llama):
    model, transcoders = llama
    with pytest.raises(ValueError, match="changes must be a list of FeatureChange"):
        intervene(model, PROMPT, transcoders, ["0:1=2"])
    with pytest.raises(ValueError, match="freeze="):
        intervene(model, PROMPT, transcoders, [], freeze=["all"])


# ---- the command line ------------------------------------------------------------------------------------
@pytest.mark.parametrize("option, words", [(["--clamp", "0:0=1e999"], "value must be a finite number"),
                                           (["--steer", "0:0@1=-1e308"], "added value must be a finite number"),
                                           (["--clamp", "0:0=1.2.3"], "--clamp")])
def test_a_clamp_or_steer_past_float32_is_one_line(tmp_path, capsys, option, words):
    assert status(BASE + ["--out", str(tmp_path / "g.json")] + option) == 2
    one_line(capsys, words)


def test_an_out_name_that_is_not_utf8_is_refused_before_the_model_loads(tmp_path, capsys):
    name = str(tmp_path / "g\udcff.json")  # how Python holds the byte 0xff of a name from the shell
    assert status(BASE + ["--out", name]) == 2
    one_line(capsys, "--out", "not valid UTF-8")


def test_a_set_with_nan_weights_is_one_line_naming_its_file(tmp_path, capsys):
    folder = tmp_path / "set"
    shutil.copytree(FIXTURES / "plt_jumprelu", folder)
    tensors = load_file(str(folder / "layer_2.safetensors"))
    tensors["W_dec"][0, 0] = math.nan
    (folder / "layer_2.safetensors").write_bytes(save(tensors))
    assert status(BASE[:4] + ["--transcoders", str(folder), "--out", str(tmp_path / "g.json")]) == 2
    one_line(capsys, "layer_2.safetensors", "W_dec of layer 2 holds NaN")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("listing", ["[" * 100_000 + "]" * 100_000, '{"graphs": 5}', '{"graphs": [1, "a", null]}',
                                     "\xff\xfe not json", "[]"])
def test_a_listing_that_cannot_be_read_is_replaced(tmp_path, capsys, listing):
    (tmp_path / "graph-metadata.json").write_text(listing, encoding="latin-1")
    assert main(BASE + ["--out", str(tmp_path / "g.json"), "--quiet"]) == 0
    graphs = json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"]
    assert [entry["slug"] for entry in graphs] == ["g"]


def test_json_is_written_without_nan(tmp_path, llama):
    model, transcoders = llama
    graph = attribution_graph(model, PROMPT, transcoders)
    graph.meta.update(replacement=math.nan, completeness=math.inf, odd=[math.nan, {"x": -math.inf}])
    graph.nodes[-1] = dataclasses.replace(graph.nodes[-1], value=math.nan)  # a logit's probability, on the page
    for path in (tmp_path / "g.json", tmp_path / "g.safetensors", tmp_path / "g.html"):
        save_graph(graph, path)

    def refuse(constant):
        raise AssertionError(f"{constant} written into JSON")
    json.loads((tmp_path / "g.json").read_text(), parse_constant=refuse)
    assert load_graph(tmp_path / "g.safetensors").meta["odd"] == [None, {"x": None}]
    page = (tmp_path / "g.html").read_text()
    block = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S).group(1)
    json.loads(block, parse_constant=refuse)  # what the page's JSON.parse reads


# ---- text read in bounded pieces ---------------------------------------------------------------------------
class Counting:
    """A tokenizer that counts the characters it is given: one id a character."""

    def __init__(self):
        self.read = 0

    def encode(self, text, add_special_tokens=False):
        self.read += len(text)
        return [ord(c) % 23 for c in text]


def test_contexts_are_read_only_up_to_their_cap(tmp_path):
    from anatomy.circuits.features import context_tokens

    path = tmp_path / "big.txt"
    path.write_text("word " * 2_000_000)  # 10 MB, one line
    tokenizer = Counting()
    tokens = context_tokens([str(path)], tokenizer, 1000)
    assert len(tokens) == 1000 and tokenizer.read < 10_000


# ---- graph files ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph_file(llama, tmp_path_factory):
    model, transcoders = llama
    path = tmp_path_factory.mktemp("graph") / "g.safetensors"
    save_graph(attribution_graph(model, PROMPT, transcoders), path)
    return path


def rewritten(tmp_path, source, tensors=None, header=None, drop=()) -> Path:
    from safetensors import safe_open

    with safe_open(str(source), "pt") as handle:
        found, meta = {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata())
    found.update(tensors or {})
    meta.update(header or {})
    path = tmp_path / "g.safetensors"
    path.write_bytes(save({k: v for k, v in found.items() if k not in drop}, metadata=meta))
    return path


N = 197  # the nodes of the fixture's graph (test_circuits_cli)


def _n():
    return N


@pytest.mark.parametrize("case, words", [
    (lambda: dict(tensors={"adjacency": torch.full((_n(), _n()), math.nan)}), "adjacency holds NaN"),
    (lambda: dict(tensors={"kind": torch.full((_n(),), -1)}), "kind index is outside"),
    (lambda: dict(tensors={"layer": torch.full((_n(),), -7)}), "layer is outside"),
    (lambda: dict(tensors={"value": torch.full((_n(),), math.inf, dtype=torch.float64)}), "value holds an infinity"),
    (lambda: dict(tensors={"kind": torch.zeros(_n(), dtype=torch.int32)}), "kind is torch.int32"),
    (lambda: dict(tensors={"extra": torch.zeros(1)}), "holds a tensor 'extra'"),
    (lambda: dict(drop=("adjacency",)), "has no adjacency"),
    (lambda: dict(header={"labels": "[" * 50_000}), "'labels' is not JSON"),
    (lambda: dict(header={"labels": "[1, 2]"}), "'labels' must be"),
    (lambda: dict(header={"ports": json.dumps(["x"] * _n())}), "node port 'x'"),
    (lambda: dict(header={"meta": "[]"}), "'meta' must be a JSON dict"),
    (lambda: dict(header={"meta": '{"influence": "high"}'}), "meta 'influence' must be a list"),
    (lambda: dict(header={"meta": '{"prompt_texts": [1, 2]}'}), "prompt_texts"),
    (lambda: dict(header={"n_layers": "many"}), "n_layers and error must be numbers"),
    (lambda: dict(header={"kind": "spaghetti"}), "kind 'spaghetti'"),
    (lambda: dict(header={"format": "anatomy graph 0"}), "not a graph anatomy wrote"),
    (lambda: dict(header={"labels": json.dumps(["\udcff"] * _n())}), "lone surrogate"),
])
def test_a_graph_file_that_is_not_a_graph_is_one_value_error(tmp_path, graph_file, case, words):
    assert load_graph(graph_file).adjacency.shape == (N, N)
    path = rewritten(tmp_path, graph_file, **case())
    with pytest.raises(ValueError) as error:
        load_graph(path)
    assert words in str(error.value) and type(error.value) is ValueError


@pytest.mark.parametrize("make, words", [
    (lambda p, g: p.write_bytes(b"\x00" * 100), "not a graph file"), (lambda p, g: p.mkdir(), "not a regular file"),
    (lambda p, g: p.write_bytes(g.read_bytes()[:2000]), "not a graph file"),
    (lambda p, g: None, "No such file"),
])
def test_a_file_that_is_not_a_graph_at_all_is_one_value_error(tmp_path, graph_file, make, words):
    path = tmp_path / "g.safetensors"
    make(path, graph_file)
    with pytest.raises(ValueError, match=words):
        load_graph(path)


def test_a_graph_larger_than_memory_is_refused_from_its_header(graph_file, monkeypatch):
    import anatomy.checkpoints.memory as memory

    monkeypatch.setattr(memory, "available_memory", lambda: 1000)
    with pytest.raises(ValueError, match="more than the"):
        load_graph(graph_file)
