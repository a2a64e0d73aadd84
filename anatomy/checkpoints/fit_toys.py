"""Refit the built-in toys and rewrite their shipped weights (anatomy/checkpoints/toy_weights/).

    python -m anatomy.checkpoints.fit_toys

Each toy, in each norm variant, is fitted from seed 0 by `toys.fit_toy` (float64 Adam until every
target has probability >= 0.9) and written as float32 safetensors, with the seed and the steps it
took in the file's metadata. Run it after changing a toy's task, vocabulary or architecture;
tests/walk/test_toys.py checks that the shipped files predict every target and that a refit on
this machine predicts the same.
"""

from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import save_file

from .toys import NORM_VARIANTS, TOY_MODELS, fit_toy

FOLDER = Path(__file__).parent / "toy_weights"


def write_shipped_weights(folder: Path = FOLDER) -> list[Path]:
    """Fit every toy in every NORM_VARIANT from seed 0 and write `folder`/NAME-VARIANT.safetensors."""
    folder.mkdir(exist_ok=True)
    written = []
    for name in TOY_MODELS:
        for variant, fields in NORM_VARIANTS.items():
            state, how = fit_toy(name, **fields)
            path = folder / f"{name}-{variant}.safetensors"
            save_file(state, str(path), metadata={**how, "toy": name, "norm_position": variant})
            os.chmod(path, 0o644)
            written.append(path)
            print(f"{path.name}: fitted from seed {how['seed']} in {how['steps']} steps")
    return written


if __name__ == "__main__":
    write_shipped_weights()
