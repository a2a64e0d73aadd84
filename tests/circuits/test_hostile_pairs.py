"""Hostile pair files and task arguments of circuit discovery (issue 40), on a pre-norm toy: a .jsonl task is read
only as far as --pairs needs, a line at a time and no line past its cap; pairs that would score nothing (an
answer that is also the wrong one, a clean prompt equal to its corrupted one), empty texts, empty answer
lists and nesting past reading are refused naming the line; pairs the model gets wrong are dropped, as the
generators drop theirs. Every refusal is one ValueError, or one line with exit status 2."""

from __future__ import annotations

import json
import os

import pytest

from anatomy.checkpoints.toys import build_toy, toy_tokenizer
from anatomy.circuits.discovery import build_task, ioi, load_pairs, make_task
from cli_status import status

PAIR = {"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"}
SWAPPED = {**PAIR, "answer": PAIR["wrong"], "wrong": PAIR["answer"]}  # one of the two the model gets wrong


@pytest.fixture(scope="module")
def toy():
    model = build_toy("toy", norm_position="pre", final_norm=True).eval()
    model.tokenizer = toy_tokenizer("toy")
    return model


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory, toy):
    folder = tmp_path_factory.mktemp("prenorm-toy")
    toy.save_pretrained(folder)
    toy.tokenizer.save(folder)
    return str(folder)


def pairs_file(tmp_path, lines: list[str]) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_a_jsonl_task_is_read_only_as_far_as_its_pairs_need(toy, tmp_path):
    lines = [json.dumps(PAIR), json.dumps(SWAPPED)] * 3 + ["{not json, never read"] * 100
    task = build_task(toy, pairs_file(tmp_path, lines), 2)
    assert len(task) == 2 and task.dropped == 1  # the first 2 right of the first 6 lines, the wrong one between dropped


def test_pairs_the_model_gets_wrong_are_dropped(toy, tmp_path):
    task = build_task(toy, pairs_file(tmp_path, [json.dumps(PAIR), json.dumps(SWAPPED)]), 100)
    assert len(task) == 1 and task.dropped == 1


def test_a_line_past_its_cap_is_refused_before_it_is_read_whole(toy, tmp_path):
    line = json.dumps({**PAIR, "clean": "x" * 2_000_000})
    with pytest.raises(ValueError, match="line 1 is longer than 1,000,000 bytes"):
        load_pairs(toy, pairs_file(tmp_path, [line]))


@pytest.mark.parametrize("pair, words", [
    ({**PAIR, "wrong": PAIR["answer"]}, "is both an answer and a wrong answer"),
    ({**PAIR, "wrong": [" World", PAIR["answer"]]}, "is both an answer and a wrong answer"),
    ({**PAIR, "corrupt": PAIR["clean"]}, "the clean and corrupted prompts are the same tokens"),
    ({**PAIR, "clean": ""}, "line 2, pair 1: clean is empty"), ({**PAIR, "corrupt": "   "}, "pair 1: corrupt is empty"),
    ({**PAIR, "answer": []}, "answer must be a text or a list of 1 to 1000 texts"),
    ({**PAIR, "wrong": [""]}, "each wrong is a non-empty text"), ({**PAIR, "answer": [3]}, "each answer is a non-empty text"),
    ({**PAIR, "clean": "\ud800 World, this is"}, "lone surrogate"),
])
def test_a_pair_that_would_score_nothing_is_refused_naming_it(toy, tmp_path, pair, words):
    with pytest.raises(ValueError, match=words) as error:
        load_pairs(toy, pairs_file(tmp_path, [json.dumps(PAIR), json.dumps(pair)]))
    assert "pairs.jsonl" in str(error.value)


@pytest.mark.parametrize("line, words", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                         ('{"clean": 1}', "each line is an object"), ("\udcff", "not UTF-8")])
def test_a_line_that_is_not_a_pair_is_refused_naming_it(toy, tmp_path, line, words):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(line.encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(ValueError, match=f"pairs.jsonl line 1: .*{words}"):
        load_pairs(toy, path)


@pytest.mark.timeout(60)
def test_a_pipe_is_not_waited_on(toy, tmp_path):
    os.mkfifo(tmp_path / "pairs.jsonl")
    with pytest.raises(ValueError, match="not a file of pairs"):
        load_pairs(toy, tmp_path / "pairs.jsonl")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call, words", [
    (lambda m: ioi(m, 10**9), "n must be an integer from 1 to 100000"), (lambda m: ioi(m, 5, seed=None), "seed"),
    (lambda m: ioi(m, 5.0), "n must be"), (lambda m: build_task(m, ["ioi"]), "task must be a name"),
    (lambda m: make_task(m, "t", "clean,corrupt"), "pairs must be a list"),
    (lambda m: make_task(m, "t", [["a", "b"]]), "pair 0 must be an object"),
    (lambda m: make_task(m, "t", [PAIR], metric="x" * 10_000), "is not supported"),
])
def test_task_arguments_are_checked_before_anything_is_generated(toy, call, words):
    with pytest.raises(ValueError, match=words) as error:
        call(toy)
    assert len(str(error.value)) < 400


def test_discover_refuses_a_bad_pair_file_in_one_line(toy_folder, tmp_path, capsys):
    path = pairs_file(tmp_path, [json.dumps({**PAIR, "wrong": PAIR["answer"]})])
    assert status(["circuits", "discover", "--task", path, "--model", toy_folder, "--steps", "1"]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "both an answer and a wrong answer" in error
