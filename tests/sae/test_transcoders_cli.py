"""`anatomy sae train-transcoders | eval-transcoders` on the toy: every layer from one harvest, what the run folder
holds, resume, the memory said before it starts, and mistakes refused in one line."""

from __future__ import annotations

import json

import pytest
import yaml

from anatomy.cli import main
from cli_status import status
from anatomy.sae import load_transcoders

SENTENCE = "Hello World, this is Alejandro!\n"
TRAIN = ["sae", "train-transcoders", "--model", "toy", "--features", "8", "--k", "2", "--context", "8", "--batch-size", "32",
         "--max-steps", "6", "--warmup", "1", "--eval-every", "3", "--save-every", "3", "--log-every", "1",
         "--ce-contexts", "4", "--eval-rows", "64", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(SENTENCE * 120)
    return path



@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tc"
    assert main(TRAIN + ["--data", str(text), "--out", str(out), "--quiet"]) == 0
    return out


def test_a_run_holds_a_set_for_every_layer_in_circuit_tracers_layout(run):
    transcoders = load_transcoders(run)
    # the toy is post-norm: its MLP reads the residual stream itself
    assert (transcoders.n_layers, transcoders.d_model, transcoders.d_transcoder, transcoders.kind) == (2, 4, 8, "jumprelu")
    assert (transcoders.input_point(1), transcoders.output_point(1)) == ("blocks.1.resid_mid", "blocks.1.mlp.out")
    assert transcoders.skip(0) is not None and transcoders.metadata["model_name"] == "toy"
    config = yaml.safe_load((run / "transcoders" / "config.yaml").read_text())
    assert (config["model_kind"], config["feature_input_hook"], config["feature_output_hook"]) == \
        ("transcoder_set", "hook_resid_mid", "mlp.hook_out")
    results = json.loads((run / "eval.json").read_text())
    assert len(results["layers"]) == 2 and {"fve", "l0", "dead"} <= set(results["layers"][0])
    assert {"ce_clean", "ce_replaced", "ce_with_errors", "ce_zero", "ce_mean", "loss_recovered",
            "loss_recovered_with_errors", "loss_recovered_vs_mean"} <= set(results)
    assert abs(results["ce_with_errors"] - results["ce_clean"]) < 1e-5  # the error terms restore the model
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7)) and len(steps[0]["layers"]["fve"]) == 2
    assert any("layers" in r and "val_fve" in r["layers"] for r in records)
    assert (run / "transcoders.png").is_file()


def test_the_start_says_the_memory_it_will_hold(text, tmp_path, capsys):
    assert main(TRAIN + ["--data", str(text), "--out", str(tmp_path / "tc"), "--max-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert " at most: python and torch " in out and "model" in out and "activations" in out and "transcoders" in out
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("anatomy sae train-transcoders ->"))
    assert max(len(line) for line in lines[title + 1:title + 8]) <= 80  # the rows under the title, folded


def test_resume_continues_and_a_second_run_needs_it(run, text, capsys):
    assert status(TRAIN + ["--data", str(text), "--out", str(run), "--quiet"]) == 2
    error = capsys.readouterr().err  # named by the full subcommand, not `anatomy sae`
    assert error.startswith("anatomy sae train-transcoders: error: ") and "--resume" in error
    assert main(TRAIN + ["--data", str(text), "--out", str(run), "--resume", "--max-steps", "8", "--quiet"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))


def test_eval_transcoders_prints_every_layer_in_80_columns(run, text, capsys):
    assert main(["sae", "eval-transcoders", str(run), "--data", str(text), "--context", "8", "--ce-contexts", "2",
                 "--threads", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "  layer     FVE       L0    dead" in out and "      1  " in out and "no error terms: CE" in out
    # redirected, each stage is said as it starts: minutes of evaluation are never silent in a log
    stages = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[")]
    assert stages == ["loading the transcoders …", "loading the model …", "reading the text …", "evaluating …"]
    assert out.index("evaluating …") < out.index("anatomy sae eval-transcoders")
    assert max(len(line) for line in out.splitlines() if not line.startswith("anatomy sae")) <= 80  # but the title


@pytest.mark.parametrize("arguments, message", [
    (["--kind", "topk"], "invalid choice: 'topk'"),
    (["--input-point", "blocks.L.nothing"], "input point 'blocks.L.nothing' is not in block 0 of this model; allowed:"),
    (["--features", "100000000"], "more than the"),
])
def test_mistakes_are_one_line(text, tmp_path, capsys, arguments, message):
    assert status(TRAIN + ["--data", str(text), "--out", str(tmp_path / "tc")] + arguments) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") <= 2
    assert not (tmp_path / "tc" / "checkpoints").exists()


def test_one_layer_of_a_set_is_evaluated_and_shown_as_an_sae(run, text, tmp_path, capsys):
    assert main(["sae", "eval", str(run), "--layer", "1", "--data", str(text), "--context", "8", "--ce-contexts", "2",
                 "--threads", "1", "--no-progress"]) == 0
    assert "L0" in capsys.readouterr().out
    page = tmp_path / "features.html"
    assert main(["sae", "features", str(run), "--layer", "0", "--data", str(text), "--context", "8", "--out", str(page),
                 "--threads", "1", "--no-progress"]) == 0
    assert page.stat().st_size > 1000
    assert status(["sae", "eval", str(run), "--data", str(text)]) == 2
    assert "choose one with --layer 0 .. 1" in capsys.readouterr().err
