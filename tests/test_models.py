"""Properties of the three families that a user relies on."""

import dataclasses

import pytest
import torch

import anatomy
from anatomy import ModelConfig, build_model

VOCAB = 23


def tiny(arch, **overrides):
    fields = dict(arch=arch, vocab_size=VOCAB, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_seq_len=32)
    fields.update(overrides)
    return ModelConfig(**fields)


def run(model, ids, mask=None, tgt=None, tgt_mask=None):
    if model.config.arch == "encoder-decoder":
        return model(ids, tgt, src_padding_mask=mask, tgt_padding_mask=tgt_mask)
    return model(ids, padding_mask=mask)


VARIANTS = {
    "paper": dict(pos_encoding="sinusoidal", norm_position="post", activation="relu", scale_embeddings=True),
    "gpt2": dict(pos_encoding="learned", norm_position="pre", activation="gelu_tanh"),
    "llama": dict(pos_encoding="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=2, attn_bias=False, mlp_bias=False),
    "alibi": dict(pos_encoding="alibi", norm_position="pre"),
}
FAMILIES = ["encoder", "decoder", "encoder-decoder"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", FAMILIES)
def test_eager_equals_sdpa_with_padding_and_causal_masks(arch, variant):
    config = tiny(arch, **VARIANTS[variant])
    fused = build_model(config, seed=0).eval()
    eager = build_model(config.replace(attn_impl="eager")).eval()
    eager.load_state_dict(fused.state_dict())
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 3:] = False
    tgt, tgt_mask = ids[:, :7], mask[:, :7]
    with torch.no_grad():
        for m, tm in [(None, None), (mask, tgt_mask)]:
            a, b = run(fused, ids, m, tgt, tm), run(eager, ids, m, tgt, tm)
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_causality_future_tokens_change_nothing_before(arch, variant):
    model = build_model(tiny(arch, **VARIANTS[variant]), seed=0).eval()
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    t = 4
    changed[:, t + 1:] = (changed[:, t + 1:] + 5) % VOCAB
    with torch.no_grad():
        if arch == "decoder":
            a, b = model(ids).logits, model(changed).logits
        else:  # the same source; the target changes after t
            a, b = model(ids, ids).logits, model(ids, changed).logits
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_encoder_is_bidirectional():
    model = build_model(tiny("encoder"), seed=0).eval()
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    with torch.no_grad():
        assert not torch.allclose(model(ids).last_hidden_state[0, 0], model(changed).last_hidden_state[0, 0])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", FAMILIES)
def test_padded_batch_equals_each_sequence_alone(arch, variant):
    model = build_model(tiny(arch, **VARIANTS[variant]), seed=0).eval()
    gen = torch.Generator().manual_seed(4)
    lengths = [7, 4, 1]
    sequences = [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = True
    with torch.no_grad():
        batch = run(model, ids, mask, ids, mask)
        for row, seq in enumerate(sequences):
            alone = run(model, seq[None], None, seq[None], None)
            n = len(seq)
            torch.testing.assert_close(batch.logits[row, :n], alone.logits[0], atol=1e-5, rtol=1e-5)
            assert not torch.isnan(batch.logits).any()


def test_left_padding_gives_no_nan_and_zero_attention_rows():
    model = build_model(tiny("decoder", attn_impl="eager"), seed=0).eval()
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :3] = False  # left padding: query 0 of row 1 may attend to nothing
    with anatomy.trace(model, "blocks.0.attn.pattern") as t:
        out = model(ids, padding_mask=mask)
    assert not torch.isnan(out.logits).any()
    assert torch.all(t["blocks.0.attn.pattern"][1, :, 0] == 0)


def test_without_positions_the_encoder_is_permutation_equivariant():
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(6))
    permutation = torch.randperm(8, generator=torch.Generator().manual_seed(7))
    for pos_encoding, equivariant in [("none", True), ("sinusoidal", False), ("learned", False)]:
        model = build_model(tiny("encoder", pos_encoding=pos_encoding), seed=0).eval()
        with torch.no_grad():
            permuted_output = model(ids[:, permutation]).last_hidden_state
            output_permuted = model(ids).last_hidden_state[:, permutation]
        assert torch.allclose(permuted_output, output_permuted, atol=1e-5) == equivariant, pos_encoding


@pytest.mark.parametrize("attn_impl", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_gradcheck_float64(arch, attn_impl):
    """Analytic gradients equal finite differences, through every layer, w.r.t. the embeddings."""
    config = ModelConfig(arch=arch, vocab_size=7, d_model=4, n_heads=2, n_layers=1, d_ff=8, max_seq_len=8,
                         attn_impl=attn_impl)
    model = build_model(config, seed=0).double()
    ids = torch.tensor([[1, 3, 4, 6]])
    points = ["embed"] if arch != "encoder-decoder" else ["encoder.embed", "decoder.embed"]

    def logits_of(*deltas):
        # Perturb the token embeddings through trace-point interventions: x -> x + delta.
        shifts = {name: (lambda x, d=d: x + d) for name, d in zip(points, deltas)}
        with anatomy.trace(model, names=[], interventions=shifts):
            if arch == "encoder-decoder":
                return model(ids, ids[:, :3]).logits
            return model(ids).logits

    deltas = [torch.zeros(1, 4 if name != "decoder.embed" else 3, 4, dtype=torch.float64, requires_grad=True)
              for name in points]
    assert torch.autograd.gradcheck(logits_of, tuple(deltas), eps=1e-6, atol=1e-5)


def test_grouped_query_attention_equals_repeated_heads():
    gqa = build_model(tiny("decoder", n_kv_heads=2), seed=0).eval()
    mha = build_model(tiny("decoder", n_kv_heads=4)).eval()
    state = gqa.state_dict()
    d_head = 4
    for key in list(state):
        if key.endswith(("attn.k_proj.weight", "attn.v_proj.weight", "attn.k_proj.bias", "attn.v_proj.bias")):
            # Key/value head j serves query heads 2j and 2j+1: repeat each head's rows twice.
            rows = state[key].reshape(2, d_head, *state[key].shape[1:])
            state[key] = rows.repeat_interleave(2, dim=0).reshape(4 * d_head, *state[key].shape[1:])
    mha.load_state_dict(state)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids).logits, mha(ids).logits)


@pytest.mark.parametrize("arch", FAMILIES)
def test_config_json_and_state_dict_round_trip(arch, tmp_path):
    config = tiny(arch, **VARIANTS["llama"])
    model = build_model(config, seed=0).eval()
    path = tmp_path / "config.json"
    config.to_json(path)
    restored = ModelConfig.from_json(path)
    assert restored == config
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    clone = build_model(restored, seed=123).eval()
    clone.load_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(run(model, ids, tgt=ids).logits, run(clone, ids, tgt=ids).logits, rtol=0, atol=0)


def test_outputs_are_one_dataclass_per_family():
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(10))
    outputs = {
        "encoder": build_model(tiny("encoder"))(ids),
        "decoder": build_model(tiny("decoder"))(ids),
        "encoder-decoder": build_model(tiny("encoder-decoder"))(ids, ids[:, :3]),
    }
    assert type(outputs["encoder"]) is anatomy.EncoderOutput
    assert type(outputs["decoder"]) is anatomy.DecoderOutput
    assert type(outputs["encoder-decoder"]) is anatomy.Seq2SeqOutput
    assert outputs["encoder"].logits.shape == (2, 5, VOCAB)
    assert outputs["decoder"].last_hidden_state.shape == (2, 5, 16)
    assert outputs["encoder-decoder"].logits.shape == (2, 3, VOCAB)
    assert outputs["encoder-decoder"].encoder_last_hidden_state.shape == (2, 5, 16)


def test_classification_heads_and_pooling():
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(11))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    for pooling in ("first", "mean"):
        model = build_model(tiny("encoder", head="sequence-classification", num_labels=3, pooling=pooling), seed=0).eval()
        with torch.no_grad():
            out = model(ids, padding_mask=mask)
            alone = model(ids[1:, :3])
        assert out.logits.shape == (2, 3)
        torch.testing.assert_close(out.logits[1], alone.logits[0], atol=1e-5, rtol=1e-5)  # pads are ignored
    model = build_model(tiny("encoder", head="token-classification", num_labels=5)).eval()
    assert model(ids).logits.shape == (2, 6, 5)


def test_tied_embeddings_share_one_matrix():
    model = build_model(tiny("encoder-decoder"))
    assert model.lm_head.proj.weight is model.encoder.token_embedding.weight
    assert model.decoder.token_embedding is model.encoder.token_embedding
    untied = build_model(tiny("decoder", tie_embeddings=False))
    assert untied.lm_head.proj.weight is not untied.token_embedding.weight


def test_presets():
    assert anatomy.preset("paper-base").d_model == 512 and anatomy.preset("paper-base").arch == "encoder-decoder"
    assert anatomy.preset("bert-base").n_layers == 12 and anatomy.preset("gpt2-small").n_heads == 12
    toy = anatomy.preset("toy")
    assert (toy.d_model, toy.n_heads, toy.d_ff, toy.n_layers) == (4, 2, 8, 2)
    assert anatomy.preset("toy", arch="encoder").head == "masked-lm"
    assert dataclasses.replace(toy, dropout=0.5).dropout == 0.5
