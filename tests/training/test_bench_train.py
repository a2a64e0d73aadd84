"""`anatomy bench --only train` compares like with like: the nanoGPT-shaped model it times against is the
same function as anatomy's model on the same weights (loss and gradients), so the ratio measures speed only."""

import torch

from anatomy import ModelConfig, build_model
from anatomy.bench.train import NanoGPT


def test_the_nanogpt_shaped_model_computes_anatomys_loss_and_gradients():
    config = ModelConfig(arch="decoder", vocab_size=65, d_model=32, n_heads=4, n_layers=2, d_ff=128, max_seq_len=16,
                         pos_encoding="learned", attn_bias=False, attn_out_bias=False, mlp_bias=False)
    ours = build_model(config, seed=0)
    nano = NanoGPT(65, 16, 2, 4, 32).copy_from(ours)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 65, (3, 16), generator=generator), torch.randint(0, 65, (3, 16), generator=generator)
    loss, theirs = ours.loss(x, targets=y), nano(x, y)[1]
    torch.testing.assert_close(loss, theirs, atol=1e-5, rtol=1e-5)
    loss.backward()
    theirs.backward()
    for mine, block in zip(nano.h, ours.blocks):
        qkv = torch.cat([block.attn.q_proj.weight.grad, block.attn.k_proj.weight.grad, block.attn.v_proj.weight.grad])
        torch.testing.assert_close(mine.attn.c_attn.weight.grad, qkv, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.c_fc.weight.grad, block.mlp.fc_in.weight.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(nano.wte.weight.grad, ours.token_embedding.weight.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(nano.wpe.weight.grad, ours.position_embedding.weight.grad, atol=1e-5, rtol=1e-4)


def test_the_muon_row_times_every_side_on_the_blocks_matrices():
    from anatomy.bench.common import Settings
    from anatomy.bench.train import bench_muon

    row = bench_muon(Settings(quick=True, repeats=2))
    assert "7 matrices" in row.case  # one block: q, k, v, o and SwiGLU's three
    assert row.ours > 0 and row.theirs > 0 and not row.higher_is_better
