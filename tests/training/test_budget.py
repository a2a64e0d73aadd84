"""The training budget: a lower bound on what a step holds, so that it refuses only what cannot fit,
and refuses absurd sizes before anything is allocated."""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, preset
from anatomy.cli import main
from anatomy.training.budget import activation_bytes, check_training_memory, minimum_parameters


def saved_for_backward(model, inputs: dict) -> int:
    """Bytes of the distinct tensors autograd keeps from one forward pass (parameters excluded)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**inputs).logits.sum()
    return sum(storages.values())


@pytest.mark.parametrize("arch, attn_impl", [("decoder", "sdpa"), ("decoder", "eager"), ("encoder", "eager"),
                                             ("encoder-decoder", "sdpa")])
def test_the_activation_estimate_never_exceeds_what_a_step_keeps(arch, attn_impl):
    config = preset("toy", arch=arch, vocab_size=50, d_model=32, n_heads=4, d_ff=96, n_layers=2, max_seq_len=24,
                    dropout=0.1, attn_impl=attn_impl, **({"head": "masked-lm"} if arch == "encoder" else {}))
    torch.manual_seed(0)
    model = build_model(config).train()
    ids = torch.randint(0, 50, (3, 24))
    inputs = {"src_ids": ids, "tgt_ids": ids} if arch == "encoder-decoder" else {"input_ids": ids}
    assert 0 < activation_bytes(config, 3, 24) <= saved_for_backward(model, inputs)


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_the_parameter_bound_is_below_the_real_count(arch):
    for fields in ({}, {"n_kv_heads": 1, "activation": "swiglu"}, {"n_experts": 4, "n_experts_per_token": 1},
                   {"d_head": 3, "tie_embeddings": False}):
        if arch != "decoder" and "n_experts" in fields:
            continue
        config = preset("toy", arch=arch, vocab_size=50, d_model=32, n_heads=4, d_ff=96, n_layers=3, **fields)
        assert 0 < minimum_parameters(config) <= sum(p.numel() for p in build_model(config).parameters()), fields


def test_a_step_past_the_memory_is_refused_naming_the_sizes():
    config = preset("toy", vocab_size=50, d_model=64, n_heads=4, max_seq_len=64)
    assert check_training_memory(config, 2, 64, "cpu", "this run") > 0
    with pytest.raises(ValueError, match="this run: .*needs (at least|about) .* Gi?B"):
        check_training_memory(config.replace(d_model=2**20, d_ff=2**22, n_heads=2**10), 2, 64, "cpu", "this run")


@pytest.mark.parametrize("option, value", [("--context", "1000000000000"), ("--d-model", "1000000000"),
                                           ("--batch-size", "100000000"), ("--d-ff", "100000000000")])
def test_absurd_sizes_are_refused_before_anything_runs(option, value, tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be\n" * 10)
    argv = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"), option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("GB" in err or "GiB" in err), err
    assert not (tmp_path / "run").exists()  # refused before the run folder was touched
