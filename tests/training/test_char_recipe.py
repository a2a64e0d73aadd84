"""recipes/char_shakespeare.sh's VARIANT=muon: what it hands to `anatomy train lm`, run on a small text.

The recipe's model shape is overridden (extra arguments come last and win) so that the run is small;
the variant's own choices are what the test reads back from the run's train_args.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

from anatomy.training.metrics import read_metrics

RECIPE = Path(__file__).parents[2] / "recipes" / "char_shakespeare.sh"
SMALL = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "16", "--context", "8", "--batch-size", "2",
         "--eval-every", "0", "--log-every", "1000", "--save-every", "0", "--quiet"]


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    text = tmp_path / "input.txt"
    if not text.exists():
        text.write_text("To be, or not to be, that is the question:\n" * 40, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DATA": str(text), "VARIANT": "muon"}
    out = tmp_path / name
    done = subprocess.run(["bash", str(RECIPE), str(out), *SMALL, "--cache-dir", str(tmp_path / "cache"), *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_the_muon_variant_trains_1900_steps_with_its_orthogonalisation(tmp_path):
    """1900 steps (5% fewer than the other variants' 2000, the price of Muon's step), Muon at 5e-3
    with two Polar Express iterations after the Gram bound, on the modern variant's model."""
    out = _run(tmp_path, "muon")
    args = json.loads((out / "train_args.json").read_text())
    assert args["max_steps"] == 1900
    assert (args["optimizer"], args["lr"]) == ("muon", 5e-3)
    assert (args["ns_coefficients"], args["ns_steps"], args["ns_norm"]) == ("polar-express", 2, "gram")
    assert (args["activation"], args["pos_encoding"], args["bias"]) == ("swiglu", "rotary", False)
    assert read_metrics(out)[-1]["step"] == 1900


def test_a_step_count_given_to_the_recipe_wins(tmp_path):
    out = _run(tmp_path, "short", "--max-steps", "3")
    assert json.loads((out / "train_args.json").read_text())["max_steps"] == 3
    assert read_metrics(out)[-1]["step"] == 3
