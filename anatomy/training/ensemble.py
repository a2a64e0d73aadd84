"""An ensemble of classifiers: the mean of their class probabilities (`anatomy train classify --ensemble-with`).

For K trained classifiers p_1 .. p_K and a text x:

    p(c | x) = (1 / K) sum_k p_k(c | x),    the prediction argmax_c p(c | x),    its loss -log p(y | x)

Models trained from different seeds (and, here, different WordPiece vocabularies) make partly
different mistakes; where one is unsure and another sure, the mean follows the sure one
(Dietterich, 2000, "Ensemble Methods in Machine Learning"; Lakshminarayanan et al., 2017). Two
encoders of half the steps each cost what one of all the steps does (recipes/sst2_scratch.sh,
VARIANT=ensemble; recipes/README.md measures it).

Each member reads the texts with its own tokenizer, so members need not share a vocabulary; they
must share the classes, in the same order (their run folder's labels.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..terminal import one_line
from .checkpoint import load_trained
from .data import classification_data

__all__ = ["check_member_runs", "ensemble_metrics", "load_members"]


def check_member_runs(runs: list[str], val: str | None) -> None:
    """Before anything is trained: each run folder holds a finished classifier (model/ and
    labels.json, as `anatomy train classify` leaves them), and there is a --val to score. ValueError
    names the first that does not."""
    if runs and val is None:
        raise ValueError("--ensemble-with scores the ensemble on --val: give --val")
    for run in runs:
        folder = Path(run)
        if not (folder / "model" / "model.safetensors").is_file() or not (folder / "labels.json").is_file():
            raise ValueError(f"--ensemble-with {one_line(run, 100)}: not a finished `anatomy train classify` run "
                             "(it needs model/model.safetensors and labels.json)")


def load_members(runs: list[str], val: str, label_names: list[str], cache_dir=None) -> list[tuple]:
    """(model in eval mode, its tokenizer, `val` in its tokens) for each run folder; ValueError when a
    run is not an encoder classifier or its classes differ from `label_names`."""
    members = []
    for run in runs:
        names = json.loads((Path(run) / "labels.json").read_text(encoding="utf-8"))
        if names != label_names:
            raise ValueError(f"--ensemble-with {one_line(run, 100)} classifies into {one_line(str(names), 100)}; "
                             f"this run into {one_line(str(label_names), 100)}: an ensemble needs the same classes")
        model, tok = load_trained(Path(run) / "model")
        if model.config.arch != "encoder" or model.config.head != "sequence-classification":
            raise ValueError(f"--ensemble-with {one_line(run, 100)} holds a {model.config.arch} with a "
                             f"{model.config.head} head, not an encoder classifier")
        seqs, _, _ = classification_data(val, tok, label_names, cache_dir=cache_dir)
        members.append((model, tok, seqs))
    return members


def ensemble_metrics(probabilities, labels) -> dict:
    """{"ensemble_loss", "ensemble_accuracy"} of the mean of K members' class probabilities, a list
    of (N, C) tensors, against labels (N,)."""
    mean = torch.stack(probabilities).mean(0)  # (N, C): (K, N, C) averaged over the members
    chosen = mean.gather(1, labels[:, None]).squeeze(1)  # (N,): p(y | x)
    return {"ensemble_loss": -chosen.clamp(min=1e-12).log().mean().item(),
            "ensemble_accuracy": (mean.argmax(-1) == labels).float().mean().item()}
