"""detect_heads finds heads planted by hand: a previous-token head in layer 0 and the induction
head that reads it in layer 1 (Olsson et al. 2022's two-layer circuit)."""

from __future__ import annotations

import math

import pytest
import torch

import anatomy

VOCAB, LENGTH = 16, 8  # sequences of 8 distinct tokens out of 16, repeated: 16 positions


def planted_model() -> torch.nn.Module:
    """Two layers, two heads of width 32; L0H0 attends to the previous token and writes its identity
    into dims 32..47; L1H0 attends where that written identity equals the current token: induction;
    L0H1 attends to the earlier position of its own token (a duplicate-token head) and writes nothing.

    Residual dims: 0..15 the token (one-hot), 16..17 (cos, sin) of angle p*theta, 18..19 of (p-1)*theta,
    32..47 the previous token. Post-norm with RMSNorm, so layer 0 reads the embeddings as they are.
    """
    config = anatomy.ModelConfig(
        arch="decoder", vocab_size=VOCAB, d_model=64, n_heads=2, n_layers=2, d_ff=8, max_seq_len=2 * LENGTH,
        pos_encoding="learned", norm="rmsnorm", norm_position="post", final_norm=False, attn_impl="eager",
        attn_bias=False, attn_out_bias=False, mlp_bias=False, tie_embeddings=False,
    )
    model = anatomy.build_model(config, seed=0).eval()
    theta = math.pi / (2 * LENGTH)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.zero_()
        model.token_embedding.weight[:, :VOCAB] = torch.eye(VOCAB)
        for p in range(2 * LENGTH):
            model.position_embedding.weight[p, 16:20] = torch.tensor(
                [math.cos(p * theta), math.sin(p * theta), math.cos((p - 1) * theta), math.sin((p - 1) * theta)])
        previous = model.blocks[0].attn  # head 0: rows 0..31 of q/k/v, columns 0..31 of o
        previous.q_proj.weight[0:2, 18:20] = 10000 * torch.eye(2)  # query: my position - 1
        previous.k_proj.weight[0:2, 16:18] = torch.eye(2)  # key: its position
        previous.v_proj.weight[0:VOCAB, 0:VOCAB] = torch.eye(VOCAB)  # value: its token
        previous.o_proj.weight[32:32 + VOCAB, 0:VOCAB] = torch.eye(VOCAB)  # written to dims 32..47
        # head 1 (rows 32..63 of q/k): its score is A [same token] - B cos((p - k) theta), so that the same
        # token 8 positions back (cos = 0) scores A, the query's own position A - B, any other token at
        # most 0.98 B; with A = 2B, the earlier copy takes nearly all the weight
        previous.q_proj.weight[32:32 + VOCAB, 0:VOCAB] = 400 * torch.eye(VOCAB)
        previous.k_proj.weight[32:32 + VOCAB, 0:VOCAB] = torch.eye(VOCAB)
        previous.q_proj.weight[48:50, 16:18] = -200 * torch.eye(2)
        previous.k_proj.weight[48:50, 16:18] = torch.eye(2)
        induction = model.blocks[1].attn
        induction.q_proj.weight[0:VOCAB, 0:VOCAB] = 20 * torch.eye(VOCAB)  # query: my token
        induction.k_proj.weight[0:VOCAB, 32:32 + VOCAB] = torch.eye(VOCAB)  # key: the token before it
    return model


def test_the_planted_previous_token_head_is_found():
    result = anatomy.detect_heads(planted_model(), "previous_token", length=LENGTH, batch=4)
    assert result.values.shape == (2, 2) and result.axes == ("layer", "head")
    assert result.values[0, 0] > 0.95
    others = result.values.flatten()[1:]
    assert torch.all(others < 0.6)
    assert "L0H0" in result.check


def test_the_planted_induction_head_is_found():
    result = anatomy.detect_heads(planted_model(), "induction", length=LENGTH, batch=4)
    # 15/16 at best: position 0 has no previous token, L0H0 writes its own there, so the first query of
    # the second copy splits its attention between keys 0 and 1.
    assert result.values[1, 0] > 0.9
    assert int(result.values.argmax()) == 2  # layer 1, head 0
    assert torch.all(result.values[0] < 0.2)  # the previous-token head is no induction head


def test_the_planted_duplicate_token_head_is_found():
    result = anatomy.detect_heads(planted_model(), "duplicate", length=LENGTH, batch=4)
    assert result.values[0, 1] > 0.95 and int(result.values.argmax()) == 1  # layer 0, head 1
    assert result.values[1, 0] < 0.1 and result.values[0, 0] < 0.1  # neither other planted head is a duplicate head


def test_bad_kind_and_length_are_named():
    with pytest.raises(ValueError, match="previous_token"):
        anatomy.detect_heads(planted_model(), "copying")
    with pytest.raises(ValueError, match="max_seq_len=16"):
        anatomy.detect_heads(planted_model(), "induction", length=12)
