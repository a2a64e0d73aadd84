"""Components against the seeds' hand computations: positions, the post-norm block, norms, FFN."""

import math

import pytest
import torch

import anatomy
from anatomy.blocks import Block
from anatomy.positional import RotaryEmbedding, alibi_slopes, sinusoidal_table


def test_sinusoids_follow_the_paper_formula():
    # Seed 004 computes p_3 for d_model = 4. The paper indexes the frequency by the pair i:
    # PE(3, 2i) = sin(3 / 10000^(2i/4)), PE(3, 2i+1) = cos(3 / 10000^(2i/4)).
    expected = [math.sin(3), math.cos(3), math.sin(3 / 100), math.cos(3 / 100)]
    torch.testing.assert_close(sinusoidal_table(5, 4)[3], torch.tensor(expected))
    # The seed's own vector (0.1411, 0.999, 0.00029, 0.9996) indexes by dimension; we do not.
    seed_004_vector = torch.tensor([0.14112001, 0.999, 0.00029, 0.99955003])
    assert not torch.allclose(sinusoidal_table(5, 4)[3], seed_004_vector, atol=1e-2)


def test_sinusoid_pairs_rotate_with_offset():
    # For each pair, PE(t + delta) is PE(t) rotated by delta * w_i: relative position is linear.
    table = sinusoidal_table(50, 16).double()
    delta = 7
    for i in range(8):
        w = 1 / 10000 ** (2 * i / 16)
        rotation = torch.tensor([[math.cos(delta * w), -math.sin(delta * w)],
                                 [math.sin(delta * w), math.cos(delta * w)]], dtype=torch.float64)
        pair_t = table[:40, 2 * i: 2 * i + 2]
        pair_t_delta = table[delta: 40 + delta, 2 * i: 2 * i + 2]
        torch.testing.assert_close(pair_t_delta, pair_t @ rotation, atol=1e-6, rtol=0)


def test_halves_layout_is_a_permutation_of_interleaved():
    interleaved, halves = sinusoidal_table(10, 8), sinusoidal_table(10, 8, "halves")
    torch.testing.assert_close(halves[:, :4], interleaved[:, 0::2])
    torch.testing.assert_close(halves[:, 4:], interleaved[:, 1::2])


def test_seed_003_seven_encoder_steps_equal_the_post_norm_block():
    """Seed 003: single-head attention, d_q = d_k = d_v = d_model, no W^O, ReLU FFN, post-norm."""
    torch.manual_seed(66)
    d, t = 12, 4
    config = anatomy.ModelConfig(
        arch="encoder", d_model=d, n_heads=1, d_ff=4 * d, norm_position="post", activation="relu",
        attn_bias=False, attn_out_bias=False, norm_eps=1e-6, pos_encoding="none", n_layers=1,
    )
    block = Block(config, 0).eval()
    X = torch.randn(t, d)
    W_q, W_k, W_v = torch.randn(d, d) * 0.1, torch.randn(d, d) * 0.1, torch.randn(d, d) * 0.1
    W_1, b_1 = torch.randn(d, 4 * d) * 0.1, torch.randn(4 * d) * 0.1
    W_2, b_2 = torch.randn(4 * d, d) * 0.1, torch.randn(d) * 0.1
    with torch.no_grad():  # nn.Linear computes x A^T: store the transposes
        block.attn.q_proj.weight.copy_(W_q.T)
        block.attn.k_proj.weight.copy_(W_k.T)
        block.attn.v_proj.weight.copy_(W_v.T)
        block.attn.o_proj.weight.copy_(torch.eye(d))  # the seed has no output projection
        block.mlp.fc_in.weight.copy_(W_1.T)
        block.mlp.fc_in.bias.copy_(b_1)
        block.mlp.fc_out.weight.copy_(W_2.T)
        block.mlp.fc_out.bias.copy_(b_2)

    def layer_norm(x):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)

    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # step 1
    scaled = Q @ K.T / math.sqrt(d)  # step 2
    normalized = torch.softmax(scaled, dim=-1)  # step 3
    Y = normalized @ V  # step 4
    O = layer_norm(Y + X)  # step 5
    ffn = torch.relu(O @ W_1 + b_1) @ W_2 + b_2  # step 6
    expected = layer_norm(ffn + O)  # step 7
    with torch.no_grad():
        actual = block(X[None])[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_pre_norm_block_is_seed_000_order():
    torch.manual_seed(0)
    config = anatomy.ModelConfig(arch="encoder", d_model=8, n_heads=2, d_ff=16, norm_position="pre", n_layers=1)
    block = Block(config, 0).eval()
    x = torch.randn(1, 5, 8)
    with torch.no_grad():
        x_mid = x + block.attn(block.attn_norm(x))  # x = x + attention(layer_norm_1(x))
        expected = x_mid + block.mlp(block.mlp_norm(x_mid))  # x = x + feed_forward(layer_norm_2(x))
        torch.testing.assert_close(block(x), expected)


def test_rmsnorm_and_layernorm():
    x = torch.randn(3, 8)
    config = anatomy.ModelConfig(d_model=8, n_heads=2, norm="rmsnorm", norm_eps=1e-6)
    from anatomy.layers import LayerNorm, make_norm

    rms = make_norm(config)
    torch.testing.assert_close(rms(x), x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(LayerNorm(8)(x), torch.nn.functional.layer_norm(x, (8,)))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_feed_forward_formulas(activation):
    from anatomy.layers import FeedForward

    torch.manual_seed(0)
    ffn = FeedForward(anatomy.ModelConfig(d_model=6, n_heads=2, d_ff=10, activation=activation))
    x = torch.randn(2, 3, 6)
    W1 = ffn.fc_in
    expected_hidden = {
        "relu": lambda: torch.clamp(W1(x), min=0),
        "gelu": lambda: 0.5 * W1(x) * (1 + torch.erf(W1(x) / math.sqrt(2))),
        "gelu_tanh": lambda: 0.5 * W1(x) * (1 + torch.tanh(math.sqrt(2 / math.pi) * (W1(x) + 0.044715 * W1(x) ** 3))),
        "swiglu": lambda: ffn.fc_gate(x) * torch.sigmoid(ffn.fc_gate(x)) * W1(x),
    }[activation]()
    torch.testing.assert_close(ffn(x), ffn.fc_out(expected_hidden), atol=1e-6, rtol=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(d_head=8, max_seq_len=64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()

    torch.testing.assert_close(score(5, 2), score(25, 22))
    torch.testing.assert_close(score(3, 3), (q * k).sum())  # equal positions: the rotation cancels


def test_alibi_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(12).shape == (12,)
