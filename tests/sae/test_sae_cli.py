"""`anatomy sae train|eval|features` on the toy: what a run folder holds, resume, mistakes in one line."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main
from cli_status import status
from anatomy.sae import load_sae

SENTENCE = "Hello World, this is Alejandro!\n"


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(SENTENCE * 120)
    return path


TRAIN = ["sae", "train", "--model", "toy", "--point", "blocks.1.hook_resid_post", "--features", "8", "--k", "2",
         "--context", "8", "--batch-size", "32", "--max-steps", "6", "--warmup", "1", "--eval-every", "3",
         "--save-every", "3", "--log-every", "1", "--ce-contexts", "4", "--fill-tokens", "64", "--quiet", "--threads", "1"]



@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "sae"
    assert main(TRAIN + ["--data", str(text), "--out", str(out)]) == 0
    return out


def test_a_run_folder_holds_the_sae_in_saelens_format_and_its_evaluation(run):
    sae = load_sae(run)
    assert (sae.kind, sae.k, sae.d_sae, sae.point, sae.metadata["model_name"]) == ("topk", 2, 8, "blocks.1.resid_post", "toy")
    config = json.loads((run / "sae" / "cfg.json").read_text())
    assert config["architecture"] == "topk" and config["metadata"]["hook_name"] == "blocks.1.hook_resid_post"
    results = json.loads((run / "eval.json").read_text())
    assert {"l0", "fve", "dead", "dense", "ce_clean", "ce_spliced", "ce_zero", "loss_recovered"} <= set(results)
    assert abs(results["l0"] - 2) < 1e-9
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 7)) and any("val_fve" in r for r in records)
    assert (run / "sae.png").is_file() and (run / "sae_train_config.json").is_file()


def test_a_second_run_in_the_same_folder_needs_resume(run, text, capsys):
    assert main(TRAIN + ["--data", str(text), "--out", str(run)]) == 2
    error = capsys.readouterr().err
    assert "--resume" in error and error.count("\n") == 1
    assert main(TRAIN + ["--data", str(text), "--out", str(run), "--resume"]) == 0  # already at the last step


def test_eval_and_features_read_the_run(run, text, tmp_path, capsys):
    assert main(["sae", "eval", str(run), "--data", str(text), "--context", "8", "--ce-contexts", "2"]) == 0
    out = capsys.readouterr().out
    assert "L0          2.0 active features per token" in out and "of the loss recovered" in out
    rows = [line for line in out.splitlines() if line.startswith("  ")]  # under the title, which names the run
    assert len(rows) >= 5 and max(len(line) for line in rows) <= 80, rows
    assert main(["sae", "eval", str(run), "--data", str(text), "--context", "8", "--max-tokens", "24"]) == 0
    assert "  text        24 tokens of" in capsys.readouterr().out  # three contexts of 8
    page = tmp_path / "features.html"
    assert main(["sae", "features", str(run), "--data", str(text), "--out", str(page), "--context", "8", "--quiet"]) == 0
    document = page.read_text()
    assert "default-src 'none'" in document and '"nFeatures":8' in document


@pytest.mark.parametrize("arguments, message", [
    (["--point", "blocks.9.resid_post"], "blocks.9.resid_post"),
    (["--k", "0"], "positive"),
    (["--kind", "gated"], "invalid choice"),
    (["--point", "blocks.1.mlp_norm.out", "--point-out", "blocks.1.mlp.out"], "comes before"),  # the toy is post-norm
])
def test_mistakes_end_in_one_line(text, tmp_path, capsys, arguments, message):
    assert status(TRAIN + ["--data", str(text), "--out", str(tmp_path / "r")] + arguments) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert status(["sae", "features", str(tmp_path), "--data", str(text), "--out", str(tmp_path / "x.txt")]) == 2
    assert ".html" in capsys.readouterr().err
    assert status(["sae", "eval", str(tmp_path / "nothing"), "--data", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err


def test_the_log_says_no_feature_can_be_dead_before_the_window_has_passed(text, tmp_path, capsys):
    """6 steps of 32 tokens = 192 tokens: with a window of 100 tokens the last steps may count dead features,
    the first three (96 tokens) may not; with the default 500,000 none may, and the run says so once."""
    args = [a for a in TRAIN if a != "--quiet"] + ["--no-progress", "--data", str(text)]
    assert main(args + ["--out", str(tmp_path / "short"), "--dead-tokens", "100"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("step") and "/6" in line]
    assert [("dead –" in line) for line in lines] == [True, True, True, False, False, False], lines
    assert main(args + ["--out", str(tmp_path / "default")]) == 0
    out = capsys.readouterr().out
    assert out.count("no feature can count as dead while it trains") == 1 and "dead 0.0%" not in out
