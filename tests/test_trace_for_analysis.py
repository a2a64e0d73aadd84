"""The trace for analyses: per-head outputs, gradients through recordings, TransformerLens names as
aliases, and trace state that belongs to the thread that opened it."""

import pytest
import torch

import anatomy
from trace_cases import IDS, model_of

# Per-head outputs, gradients, TransformerLens names --------------------------------------------------

def test_head_outputs_sum_to_the_attention_output():
    """sum_h head_out[:, :, h] + b^O = attn.out: each head's own write to the residual stream."""
    model = model_of(arch="decoder", norm_position="pre", final_norm=True)
    with torch.no_grad(), anatomy.trace(model, ["*.attn.head_out", "*.attn.out"]) as t:
        model(IDS)
    heads = t["blocks.1.attn.head_out"]  # [batch query head d_model]
    assert heads.shape == (1, 7, 2, 4)
    torch.testing.assert_close(heads.sum(2) + model.blocks[1].attn.o_proj.bias, t["blocks.1.attn.out"],
                               atol=1e-6, rtol=1e-5)


def test_replacing_one_head_output_equals_zeroing_its_z():
    model = model_of()

    def zero_z(z):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    def zero_out(h):
        h = h.clone()
        h[:, :, 1] = 0
        return h

    with torch.no_grad():
        with anatomy.trace(model, [], interventions={"blocks.0.attn.z": zero_z}):
            by_z = model(IDS).logits
        with anatomy.trace(model, [], interventions={"blocks.0.attn.head_out": zero_out}):
            by_head_out = model(IDS).logits
        clean = model(IDS).logits
    torch.testing.assert_close(by_head_out, by_z, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(by_z, clean)


def test_grad_true_keeps_the_recorded_tensors_in_the_graph():
    model = model_of()
    with anatomy.trace(model, ["blocks.0.resid_post", "blocks.0.attn.pattern"], grad=True) as t:
        logits = model(IDS).logits
    (grad,) = torch.autograd.grad(logits[0, -1, 2], t["blocks.0.resid_post"])
    assert grad.shape == (1, 7, 4) and grad.abs().sum() > 0
    with torch.no_grad(), anatomy.trace(model, "blocks.0.resid_post") as t:
        model(IDS)
    assert not t["blocks.0.resid_post"].requires_grad


def test_an_intervention_must_return_a_tensor_of_the_same_dtype():
    model = model_of()
    for bad, word in [(lambda z: z.double(), "float64"), (lambda z: 3, "int"), (lambda z: [1], "list")]:
        with pytest.raises(ValueError, match=word):
            with torch.no_grad(), anatomy.trace(model, interventions={"blocks.0.attn.z": bad}):
                model(IDS)


# TransformerLens hook names, and the anatomy point each one means (golden).
TRANSFORMER_LENS_NAMES = {
    "hook_embed": "embed",
    "hook_pos_embed": "pos_embed",
    "blocks.1.hook_resid_pre": "blocks.1.resid_pre",
    "blocks.1.ln1.hook_normalized": "blocks.1.attn_norm.normalized",
    "blocks.1.attn.hook_q": "blocks.1.attn.q",
    "blocks.1.attn.hook_k": "blocks.1.attn.k",
    "blocks.1.attn.hook_v": "blocks.1.attn.v",
    "blocks.1.attn.hook_attn_scores": "blocks.1.attn.scores",
    "blocks.1.attn.hook_pattern": "blocks.1.attn.pattern",
    "blocks.1.attn.hook_z": "blocks.1.attn.z",
    "blocks.1.attn.hook_result": "blocks.1.attn.head_out",
    "blocks.1.hook_attn_out": "blocks.1.attn.out",
    "blocks.1.hook_resid_mid": "blocks.1.resid_mid",
    "blocks.1.ln2.hook_normalized": "blocks.1.mlp_norm.normalized",
    "blocks.1.mlp.hook_pre": "blocks.1.mlp.pre",
    "blocks.1.mlp.hook_post": "blocks.1.mlp.post",
    "blocks.1.hook_mlp_out": "blocks.1.mlp.out",
    "blocks.1.hook_resid_post": "blocks.1.resid_post",
    "ln_final.hook_normalized": "final_norm.normalized",
}


def test_transformer_lens_names_are_aliases_of_anatomy_points():
    model = model_of(norm_position="pre", final_norm=True, pos_encoding="learned")
    with torch.no_grad():
        with anatomy.trace(model, list(TRANSFORMER_LENS_NAMES)) as theirs:
            model(IDS)
        with anatomy.trace(model, list(TRANSFORMER_LENS_NAMES.values())) as ours:
            model(IDS)
    assert list(theirs) == list(ours)
    for tl_name, name in TRANSFORMER_LENS_NAMES.items():
        assert torch.equal(theirs[tl_name], ours[name]), tl_name
    with torch.no_grad(), anatomy.trace(model, "blocks.*.hook_resid_post") as t:  # patterns too
        model(IDS)
    assert list(t) == ["blocks.0.resid_post", "blocks.1.resid_post"]
    with pytest.raises(KeyError, match="hook_resid_pre.*blocks.7.resid_pre"):
        with anatomy.trace(model, "blocks.7.hook_resid_pre"):
            pass


@pytest.mark.parametrize("norm, plus_one", [("layernorm", False), ("rmsnorm", False), ("rmsnorm", True)])
def test_hook_normalized_is_the_stream_before_the_gain_and_the_output_follows_it(norm, plus_one):
    """TransformerLens's (and circuit-tracer's) ln2.hook_normalized: x / rms, or (x - mean) / std, before the
    norm's gain and bias; the norm's output applies them to whatever the trace leaves there."""
    model = model_of(norm_position="pre", final_norm=True, norm=norm, norm_plus_one=plus_one)
    block = model.blocks[1]
    with torch.no_grad():
        for parameter in block.mlp_norm.parameters():  # a gain and bias far from 1 and 0
            parameter.copy_(torch.randn(parameter.shape) * 0.5 + 0.7)
        with anatomy.trace(model, ["blocks.1.resid_mid", "blocks.1.ln2.hook_normalized", "blocks.1.mlp_norm.out"]) as t:
            plain = model(IDS).logits
        x = t["blocks.1.resid_mid"]
        centred = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
        scale = centred.pow(2).mean(-1, keepdim=True) + block.mlp_norm.eps
        torch.testing.assert_close(t["blocks.1.ln2.hook_normalized"], centred * scale.rsqrt())
        gain = 1 + block.mlp_norm.weight if plus_one else block.mlp_norm.weight
        bias = block.mlp_norm.bias if norm == "layernorm" else 0
        torch.testing.assert_close(t["blocks.1.mlp_norm.out"], t["blocks.1.ln2.hook_normalized"] * gain + bias)
        assert torch.equal(model(IDS).logits, plain)  # recording it changes no bit of the pass
        with anatomy.trace(model, ["blocks.1.mlp_norm.out"],
                           interventions={"blocks.1.mlp_norm.normalized": lambda z: 2 * z}) as doubled:
            changed = model(IDS).logits
    torch.testing.assert_close(doubled["blocks.1.mlp_norm.out"], 2 * t["blocks.1.ln2.hook_normalized"] * gain + bias)
    assert not torch.allclose(changed, plain)


@pytest.mark.parametrize("layout", [dict(norm_position="pre"), dict(norm_position="post_sublayer", norm="rmsnorm"),
                                    dict(norm_position="sandwich", norm="rmsnorm"), dict(parallel_residual=True),
                                    dict(parallel_residual=True, parallel_shared_norm=True)])
def test_mlp_in_is_the_mlps_own_copy_of_the_stream(layout):
    """TransformerLens's hook_mlp_in: changing it changes what the MLP reads (through its norm, if it has one),
    and nothing else: the residual stream the block adds the MLP's output to is the block's own."""
    model = model_of(**{"norm_position": "pre", "final_norm": True, **layout})
    SHIFT = torch.linspace(-1.0, 2.0, model.config.d_model)  # no norm takes it away (not constant, not a scaling)
    stream = "resid_pre" if layout.get("parallel_residual") else "resid_mid"
    names = [f"blocks.1.{stream}", "blocks.1.mlp.out", "blocks.1.attn.out", "blocks.1.resid_post"]
    with torch.no_grad():
        with anatomy.trace(model, names + ["blocks.1.hook_mlp_in"]) as plain:
            model(IDS)
        assert torch.equal(plain["blocks.1.hook_mlp_in"], plain[f"blocks.1.{stream}"])
        with anatomy.trace(model, names, interventions={"blocks.1.mlp_in": lambda x: x + SHIFT}) as changed:
            model(IDS)
    assert torch.equal(changed[f"blocks.1.{stream}"], plain[f"blocks.1.{stream}"])
    assert torch.equal(changed["blocks.1.attn.out"], plain["blocks.1.attn.out"])
    assert not torch.allclose(changed["blocks.1.mlp.out"], plain["blocks.1.mlp.out"])
    block = model.blocks[1]
    norm = getattr(block, "mlp_norm", None) or getattr(block, "attn_norm", None)
    reads = plain[f"blocks.1.{stream}"] + SHIFT
    if layout.get("norm_position") != "post_sublayer":
        reads = norm(reads)
    with torch.no_grad():
        torch.testing.assert_close(changed["blocks.1.mlp.out"], block.mlp(reads))


# Threads: a trace belongs to the thread that opened it ---------------------------------------------

def test_a_plain_forward_in_another_thread_never_sees_an_intervention():
    """The 266-of-300 leak: thread A intervenes while thread B runs plain passes on the same model."""
    import threading

    model = model_of()
    with torch.no_grad():
        clean = model(IDS).logits
    started, done = threading.Event(), threading.Event()
    changed = []

    def scramble(z):
        started.set()
        return torch.zeros_like(z)

    def intervening():
        with torch.no_grad(), anatomy.trace(model, [], interventions={"blocks.0.attn.z": scramble}):
            while not done.is_set():
                model(IDS)

    worker = threading.Thread(target=intervening)
    worker.start()
    try:
        assert started.wait(10)
        with torch.no_grad():
            for _ in range(100):
                changed.append(not torch.equal(model(IDS).logits, clean))
    finally:
        done.set()
        worker.join()
    assert sum(changed) == 0
    assert all(point.fn is None and point._n_threads == 0 for point in anatomy.trace_points(model).values())


def test_disjoint_traces_in_two_threads_record_only_their_own_tensors():
    import threading

    model = model_of()
    inputs = {"a": torch.tensor([[1, 2, 3, 4]]), "b": torch.tensor([[5, 6, 0, 1, 2, 3]])}
    barrier = threading.Barrier(2)
    wrong = []

    def tracing(key):
        ids = inputs[key]
        barrier.wait()
        for _ in range(50):
            try:
                with torch.no_grad(), anatomy.trace(model, ["embed", "blocks.1.resid_post"]) as t:
                    model(ids)
                    expected = model(ids).last_hidden_state
            except Exception as error:  # e.g. "already being traced" by the other thread
                wrong.append(f"{key}: {error}")
                continue
            if t["embed"].shape[1] != ids.shape[1] or not torch.equal(t["blocks.1.resid_post"], expected):
                wrong.append(key)

    threads = [threading.Thread(target=tracing, args=(key,)) for key in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
