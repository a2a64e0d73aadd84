"""An SAE folder's values are echoed in a refusal cut short: a hostile cfg.json makes a short message."""

import json

import pytest

from anatomy.checkpoints import CheckpointError
from anatomy.sae import SAE, load_sae


@pytest.mark.parametrize("field, value", [("architecture", "x" * 10_000), ("k", "9" * 10_000), ("d_in", "8" * 10_000),
                                          ("dtype", "f" * 10_000), ("normalize_activations", "y" * 10_000)])
def test_a_hostile_config_value_is_cut_in_the_message(tmp_path, field, value):
    SAE(8, 16, kind="topk", k=2, point="blocks.0.resid_post", seed=0).save(tmp_path)
    config = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(CheckpointError) as refused:
        load_sae(tmp_path)
    assert len(str(refused.value)) < 500 and "…" in str(refused.value), str(refused.value)[:300]
