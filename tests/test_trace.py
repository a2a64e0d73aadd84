"""The trace API: names are a stable contract, recordings are the pass's own tensors, and
interventions change exactly what they target and are always removed."""

import pytest
import torch

import anatomy
from trace_cases import IDS, TARGET, model_of, run

# Golden, ordered lists of names: renaming or moving a trace point is a visible decision. -----------

BLOCK_POINTS = [
    "resid_pre", "attn_norm.normalized", "attn_norm.out", "attn.q", "attn.k", "attn.v", "attn.scores",
    "attn.pattern", "attn.z",
    "attn.head_out", "attn.out", "resid_mid", "mlp_in", "mlp_norm.normalized", "mlp_norm.out", "mlp.pre", "mlp.post",
    "mlp.out", "resid_post",
]

ON_REQUEST = ("head_out", "normalized", "mlp_in")  # recorded only when named

GOLDEN = {
    # preset("toy"): decoder, 2 layers, sinusoidal positions
    "decoder": [
        "embed", "pos_embed",
        "blocks.0.resid_pre", "blocks.0.attn_norm.normalized", "blocks.0.attn_norm.out", "blocks.0.attn.q",
        "blocks.0.attn.k", "blocks.0.attn.v",
        "blocks.0.attn.scores", "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.0.attn.head_out",
        "blocks.0.attn.out",
        "blocks.0.resid_mid", "blocks.0.mlp_in", "blocks.0.mlp_norm.normalized", "blocks.0.mlp_norm.out",
        "blocks.0.mlp.pre",
        "blocks.0.mlp.post", "blocks.0.mlp.out",
        "blocks.0.resid_post",
        "blocks.1.resid_pre", "blocks.1.attn_norm.normalized", "blocks.1.attn_norm.out", "blocks.1.attn.q",
        "blocks.1.attn.k", "blocks.1.attn.v",
        "blocks.1.attn.scores", "blocks.1.attn.pattern", "blocks.1.attn.z", "blocks.1.attn.head_out",
        "blocks.1.attn.out",
        "blocks.1.resid_mid", "blocks.1.mlp_in", "blocks.1.mlp_norm.normalized", "blocks.1.mlp_norm.out",
        "blocks.1.mlp.pre",
        "blocks.1.mlp.post", "blocks.1.mlp.out",
        "blocks.1.resid_post",
        "logits",
    ],
    # preset("toy", arch="encoder", n_layers=1, ...): BERT's extras, token types, a norm after the
    # embeddings, a pooler
    "encoder": [
        "embed", "pos_embed", "type_embed", "embed_norm.normalized", "embed_norm.out",
        "blocks.0.resid_pre", "blocks.0.attn_norm.normalized", "blocks.0.attn_norm.out", "blocks.0.attn.q",
        "blocks.0.attn.k", "blocks.0.attn.v",
        "blocks.0.attn.scores", "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.0.attn.head_out",
        "blocks.0.attn.out",
        "blocks.0.resid_mid", "blocks.0.mlp_in", "blocks.0.mlp_norm.normalized", "blocks.0.mlp_norm.out",
        "blocks.0.mlp.pre",
        "blocks.0.mlp.post", "blocks.0.mlp.out",
        "blocks.0.resid_post",
        "pooled", "logits",
    ],
    # preset("toy", arch="encoder-decoder", n_layers=1)
    "encoder-decoder": [
        "encoder.embed", "encoder.pos_embed",
        "encoder.blocks.0.resid_pre", "encoder.blocks.0.attn_norm.normalized",
        "encoder.blocks.0.attn_norm.out", "encoder.blocks.0.attn.q",
        "encoder.blocks.0.attn.k", "encoder.blocks.0.attn.v", "encoder.blocks.0.attn.scores",
        "encoder.blocks.0.attn.pattern", "encoder.blocks.0.attn.z", "encoder.blocks.0.attn.head_out",
        "encoder.blocks.0.attn.out",
        "encoder.blocks.0.resid_mid", "encoder.blocks.0.mlp_in", "encoder.blocks.0.mlp_norm.normalized",
        "encoder.blocks.0.mlp_norm.out",
        "encoder.blocks.0.mlp.pre",
        "encoder.blocks.0.mlp.post", "encoder.blocks.0.mlp.out", "encoder.blocks.0.resid_post",
        "decoder.embed", "decoder.pos_embed",
        "decoder.blocks.0.resid_pre", "decoder.blocks.0.attn_norm.normalized",
        "decoder.blocks.0.attn_norm.out", "decoder.blocks.0.attn.q",
        "decoder.blocks.0.attn.k", "decoder.blocks.0.attn.v", "decoder.blocks.0.attn.scores",
        "decoder.blocks.0.attn.pattern", "decoder.blocks.0.attn.z", "decoder.blocks.0.attn.head_out",
        "decoder.blocks.0.attn.out",
        "decoder.blocks.0.resid_mid",
        "decoder.blocks.0.cross_attn_norm.normalized", "decoder.blocks.0.cross_attn_norm.out",
        "decoder.blocks.0.cross_attn.q", "decoder.blocks.0.cross_attn.k",
        "decoder.blocks.0.cross_attn.v", "decoder.blocks.0.cross_attn.scores", "decoder.blocks.0.cross_attn.pattern",
        "decoder.blocks.0.cross_attn.z", "decoder.blocks.0.cross_attn.head_out",
        "decoder.blocks.0.cross_attn.out", "decoder.blocks.0.resid_cross",
        "decoder.blocks.0.mlp_in", "decoder.blocks.0.mlp_norm.normalized", "decoder.blocks.0.mlp_norm.out",
        "decoder.blocks.0.mlp.pre",
        "decoder.blocks.0.mlp.post",
        "decoder.blocks.0.mlp.out", "decoder.blocks.0.resid_post",
        "logits",
    ],
    # a Llama-like decoder: rotary positions (no pos_embed; q_rot and k_rot), pre-norm, a final norm
    "decoder-rotary-prenorm": [
        "embed",
        "blocks.0.resid_pre", "blocks.0.attn_norm.normalized", "blocks.0.attn_norm.out", "blocks.0.attn.q",
        "blocks.0.attn.k", "blocks.0.attn.v",
        "blocks.0.attn.q_rot", "blocks.0.attn.k_rot", "blocks.0.attn.scores", "blocks.0.attn.pattern",
        "blocks.0.attn.z", "blocks.0.attn.head_out", "blocks.0.attn.out", "blocks.0.resid_mid",
        "blocks.0.mlp_in", "blocks.0.mlp_norm.normalized", "blocks.0.mlp_norm.out", "blocks.0.mlp.pre",
        "blocks.0.mlp.post", "blocks.0.mlp.out", "blocks.0.resid_post",
        "final_norm.normalized", "final_norm.out", "logits",
    ],
}

CONFIGS = {
    "decoder": {},
    "encoder": dict(arch="encoder", n_layers=1, pos_encoding="learned", type_vocab_size=2, embed_norm=True,
                    pooler=True),
    "encoder-decoder": dict(arch="encoder-decoder", n_layers=1),
    "decoder-rotary-prenorm": dict(n_layers=1, pos_encoding="rotary", norm_position="pre", final_norm=True),
}


@pytest.mark.parametrize("family", list(GOLDEN))
def test_trace_point_names_are_the_golden_list_in_order(family):
    model = model_of(**CONFIGS[family])
    assert list(anatomy.trace_points(model)) == GOLDEN[family]


@pytest.mark.parametrize("family", list(GOLDEN))
def test_a_full_trace_records_every_point_once(family):
    model = model_of(**CONFIGS[family])
    with torch.no_grad(), anatomy.trace(model) as t:
        run(model)
    # Per-head outputs are H times the residual, and a norm's stream before its gain is another copy of its
    # output: computed only when named.
    assert sorted(t) == sorted(name for name in GOLDEN[family] if not name.endswith(ON_REQUEST))


def test_a_trace_iterates_in_the_order_the_pass_reached_the_points():
    # Pre-norm: each norm runs before its sublayer, so the pass follows the declaration order.
    pre = model_of(**CONFIGS["decoder-rotary-prenorm"])
    with torch.no_grad(), anatomy.trace(pre) as t:
        pre(IDS)
    assert list(t) == [name for name in GOLDEN["decoder-rotary-prenorm"] if not name.endswith(ON_REQUEST)]
    # Post-norm (the paper): each norm runs after its sublayer's residual sum.
    post = model_of(n_layers=1)
    with torch.no_grad(), anatomy.trace(post) as t:
        post(IDS)
    assert list(t) == [
        "embed", "pos_embed", "blocks.0.resid_pre", "blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v",
        "blocks.0.attn.scores", "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.0.attn.out",
        "blocks.0.attn_norm.out", "blocks.0.resid_mid", "blocks.0.mlp.pre", "blocks.0.mlp.post", "blocks.0.mlp.out",
        "blocks.0.mlp_norm.out", "blocks.0.resid_post", "logits",
    ]


# The trace is the pass's own tensors --------------------------------------------------------------

@pytest.mark.parametrize("family", list(GOLDEN))
def test_the_trace_agrees_with_the_forward_output(family):
    model = model_of(**CONFIGS[family])
    with torch.no_grad():
        plain = run(model)
        with anatomy.trace(model) as t:
            traced = run(model)
    torch.testing.assert_close(traced.logits, plain.logits)
    assert torch.equal(t["logits"], traced.logits)
    last = GOLDEN[family][-2] if family != "encoder" else "blocks.0.resid_post"
    assert torch.equal(t[last], traced.last_hidden_state)
    if family == "encoder":
        assert torch.equal(t["pooled"], traced.pooled)
    if family == "encoder-decoder":
        assert torch.equal(t["encoder.blocks.0.resid_post"], traced.encoder_last_hidden_state)


def test_each_recorded_tensor_has_its_declared_axes():
    model = model_of()
    with torch.no_grad(), anatomy.trace(model, ["blocks.0.attn.pattern", "blocks.0.attn.z", "embed"]) as t:
        model(IDS)
    assert t.axes("blocks.0.attn.pattern") == ("batch", "head", "query", "key")
    assert t["blocks.0.attn.pattern"].shape == (1, 2, 7, 7)
    assert t.axes("blocks.0.attn.z") == ("batch", "query", "head", "d_head")
    assert t["blocks.0.attn.z"].shape == (1, 7, 2, 2)
    assert len(t) == 3


def test_patterns_are_recorded_even_under_the_fused_kernel():
    model = model_of(attn_impl="sdpa")
    with torch.no_grad():
        fused = model(IDS).logits
        with anatomy.trace(model, "*attn.pattern") as t:
            traced = model(IDS).logits
    assert sorted(t) == ["blocks.0.attn.pattern", "blocks.1.attn.pattern"]
    pattern = t["blocks.1.attn.pattern"]  # [batch, head, query, key]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 2, 7))
    assert torch.all(pattern.triu(diagonal=1) == 0)  # causal: nothing above the diagonal
    torch.testing.assert_close(traced, fused, atol=1e-6, rtol=1e-5)  # the eager pass computes the same


def test_the_cross_attention_pattern_is_rectangular():
    model = model_of(arch="encoder-decoder", attn_impl="sdpa")
    with torch.no_grad(), anatomy.trace(model, "decoder.*.cross_attn.pattern") as t:
        model(IDS, TARGET)
    assert t["decoder.blocks.0.cross_attn.pattern"].shape == (1, 2, 5, 7)  # [batch, head, target, source]


# Interventions ------------------------------------------------------------------------------------

def test_zeroing_one_head_equals_recomputing_the_layer_without_it():
    """Zero head 1 of the last layer at `blocks.1.attn.z`: the logits must equal those computed by
    hand from the clean pass's tensors, with that head's output left out of the concatenation."""
    model = model_of()
    block = model.blocks[1]
    with torch.no_grad():
        with anatomy.trace(model) as clean:
            model(IDS)

        def zero_head_1(z):  # z: [batch, query, head, d_head]
            z = z.clone()
            z[:, :, 1] = 0
            return z

        with anatomy.trace(model, interventions={"blocks.1.attn.z": zero_head_1}) as t:
            logits = model(IDS).logits

        # By hand, the paper's post-norm block, with head 1's columns of the concatenation zeroed.
        z = clean["blocks.1.attn.z"].clone()
        z[:, :, 1] = 0
        attn_out = block.attn.o_proj(z.reshape(1, 7, 4))
        x = block.attn_norm(clean["blocks.1.resid_pre"] + attn_out)
        x = block.mlp_norm(x + block.mlp(x))
        expected = model.lm_head(x)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(logits, clean["logits"])  # the head mattered
    # Head 0 and everything upstream of the intervention are untouched.
    assert torch.equal(t["blocks.1.attn.z"][:, :, 0], clean["blocks.1.attn.z"][:, :, 0])
    for name in ["embed", "blocks.0.resid_post", "blocks.1.attn.pattern"]:
        assert torch.equal(t[name], clean[name])


def test_an_intervention_that_returns_none_changes_nothing():
    model = model_of()
    seen = []
    with torch.no_grad():
        clean = model(IDS).logits
        with anatomy.trace(model, [], interventions={"blocks.0.mlp.post": lambda x: seen.append(x.shape)}):
            logits = model(IDS).logits
    assert seen == [(1, 7, 8)]
    assert torch.equal(logits, clean)


def test_interventions_and_recordings_are_removed_even_when_the_pass_raises():
    model = model_of()
    points = anatomy.trace_points(model)

    def explode(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with torch.no_grad(), anatomy.trace(model, interventions={"blocks.0.attn.z": explode}):
            model(IDS)
    assert all(point.fn is None for point in points.values())
    with pytest.raises(anatomy.InputError):
        with torch.no_grad(), anatomy.trace(model):
            model(torch.tensor([[99]]))  # outside the vocabulary
    assert all(point.fn is None for point in points.values())
    with torch.no_grad(), anatomy.trace(model, "blocks.0.attn.z") as t:  # usable again afterwards
        model(IDS)
    assert list(t) == ["blocks.0.attn.z"]


def test_an_intervention_must_keep_the_shape():
    model = model_of()
    with pytest.raises(ValueError, match=r"expected \(1, 7, 2, 2\)"):
        with torch.no_grad(), anatomy.trace(model, interventions={"blocks.0.attn.z": lambda z: z[:, :1]}):
            model(IDS)


def test_a_bad_name_raises_key_error_listing_points():
    model = model_of()
    with pytest.raises(KeyError) as caught:
        with anatomy.trace(model, ["blocks.0.attn.patern"]):
            pass
    message = str(caught.value)
    assert "blocks.0.attn.patern" in message and "embed" in message and "trace_points" in message
    with pytest.raises(KeyError, match="trace_points"):
        with anatomy.trace(model, interventions={"blocks.9.attn.z": lambda z: z}):
            pass
    with torch.no_grad(), anatomy.trace(model, "embed") as t:
        model(IDS)
    with pytest.raises(KeyError, match="was not traced"):
        t["blocks.0.attn.pattern"]


def test_a_point_the_pass_never_reaches_says_so():
    model = model_of(arch="encoder-decoder")
    with torch.no_grad(), anatomy.trace(model, "encoder.*") as t:
        model.encode(IDS)  # the decoder never runs, but the encoder's points are all there
    assert "encoder.blocks.1.resid_post" in t
    with torch.no_grad(), anatomy.trace(model, ["logits"]) as t:
        model.encode(IDS)
    with pytest.raises(KeyError, match="did not reach"):
        t["logits"]


def test_glob_patterns_select_every_layer():
    model = model_of()
    with torch.no_grad(), anatomy.trace(model, ["*.resid_post", "embed"]) as t:
        model(IDS)
    assert list(t) == ["embed", "blocks.0.resid_post", "blocks.1.resid_post"]
    with torch.no_grad():
        assert torch.equal(t["embed"], model.token_embedding(IDS))
