"""GGUF files: anatomy's loader against transformers' own GGUF loader, on tiny files the gguf
package writes (every quant type, llama's permuted q/k, tied and untied heads, both tokenizer
styles), and the errors for files anatomy cannot read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from checkpoint_cases import randomise  # noqa: E402
from gguf_files import (  # noqa: E402
    CHAT_TEMPLATE, TEXTS, byte_level_vocab, llama_cpp_permute, sentencepiece_vocab, write_gguf,
)

from anatomy import CheckpointError  # noqa: E402
from anatomy.checkpoints.gguf import gguf_tokenizer, load_gguf, supported_types, unpermute_rows  # noqa: E402

ATOL = 1e-4  # the issue's bound for GGUF; the two loaders dequantize the same bytes
MIXED = {"token_embd.weight": "Q8_0", "attn_q.weight": "Q4_0", "attn_k.weight": "Q4_1", "attn_v.weight": "Q5_0",
         "attn_output.weight": "Q5_1", "ffn_gate.weight": "F16", "ffn_up.weight": "BF16", "ffn_down.weight": "Q6_K",
         "output.weight": "Q8_0"}
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def vocabs():
    return {"gpt2": byte_level_vocab(), "llama": sentencepiece_vocab()}


def tiny_llama(vocab_size: int, **fields):
    """A random transformers Llama (hidden 32, 2 layers, 4 query and 2 key/value heads); d_ff 256 so
    that down_proj's rows fill one K-quant block."""
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, max_position_embeddings=64, rms_norm_eps=1e-5, **fields)
    return random_model("LlamaForCausalLM", config)


def random_model(model_class: str, config):
    """A transformers model of `config` with every parameter drawn at random (seed 0)."""
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    randomise(model)
    return model


def original_pair(path, model, ids):
    """(anatomy's logits, the original transformers model's logits) for `ids`: the reference for
    files transformers' GGUF reader cannot read, or reads without some of their keys."""
    with torch.no_grad():
        return load_gguf(path)(ids).logits, model(ids).logits


def logits_pair(path, ids):
    """(anatomy's logits, transformers' logits) for `ids`, each loader reading the file itself."""
    ours = load_gguf(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        return ours(ids).logits, theirs(ids).logits


def ids_for(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("types, tied", [
    (MIXED, False),
    ({"": "F32"}, True),
    ({"": "F16"}, False),
    ({"": "BF16"}, True),
    *[({"ffn_down.weight": k, "": "Q8_0"}, False) for k in K_QUANTS],
], ids=["mixed", "F32-tied", "F16", "BF16-tied", *K_QUANTS])
def test_llama_logits_match_transformers_gguf_loader(tmp_path, vocabs, types, tied):
    vocab = vocabs["gpt2"]
    model = tiny_llama(len(vocab["tokens"]), tie_word_embeddings=tied)
    default = types.get("", "F32")
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama", vocab=vocab, default=default,
                      types={k: v for k, v in types.items() if k})
    ours, theirs = logits_pair(path, ids_for(len(vocab["tokens"])))
    assert ours.abs().max() > 1.0  # a random model with real spread, not near-zero logits
    assert (ours - theirs).abs().max() <= ATOL


def test_f32_file_gives_back_the_original_model(tmp_path, vocabs):
    """HF model -> GGUF (q/k rows permuted by llama.cpp's rule) -> anatomy computes what the
    original transformers model computes: the un-permutation is right, independently of
    transformers' GGUF loader."""
    vocab = vocabs["llama"]
    model = tiny_llama(len(vocab["tokens"]))
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama", vocab=vocab, default="F32")
    ids = ids_for(len(vocab["tokens"]))
    ours, theirs = original_pair(path, model, ids)
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize("shape, heads", [((32, 8), 4), ((16, 8), 2), ((16,), 2), ((64, 3), 1)])
def test_unpermute_undoes_llama_cpp_permutation(shape, heads):
    w = torch.randn(shape)
    assert torch.equal(unpermute_rows(llama_cpp_permute(w, heads), heads), w)
    assert not torch.equal(llama_cpp_permute(w, heads), w)


@pytest.mark.parametrize("arch, config_class, model_class, head_dim", [
    ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", 8),  # biases on q, k, v
    # RMSNorm on each head's q and k; transformers' GGUF reader ignores attention.key_length for
    # qwen3 and takes Qwen3Config's default head_dim, 128, so the file must have that
    ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", 128),
])
def test_qwen_is_read_without_permutation(tmp_path, vocabs, arch, config_class, model_class, head_dim):
    """llama.cpp runs Qwen with rotate_half rotary, as transformers does: its q/k rows are stored
    as they are, and un-permuting them would break the model."""
    vocab = dict(vocabs["gpt2"], pre="qwen2")
    config = getattr(transformers, config_class)(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, intermediate_size=64, max_position_embeddings=64,
        tie_word_embeddings=False)
    model = random_model(model_class, config)
    path = write_gguf(tmp_path / "q.gguf", model, arch=arch, vocab=vocab, types={"attn_q.weight": "Q8_0"})
    ours, theirs = logits_pair(path, ids_for(len(vocab["tokens"])))
    assert (ours - theirs).abs().max() <= ATOL
    f32 = write_gguf(tmp_path / "f32.gguf", model, arch=arch, vocab=vocab)
    ids = ids_for(len(vocab["tokens"]))
    ours, theirs = original_pair(f32, model, ids)
    assert (ours - theirs).abs().max() <= 1e-5


def test_gemma_norm_gains_lose_llama_cpp_offset(tmp_path, vocabs):
    """llama.cpp stores Gemma's (1 + w) RMSNorm gains as w + 1 and does not permute q/k; an F32 file
    gives back the original transformers model (whose GGUF reader has no Gemma 1)."""
    vocab = vocabs["llama"]
    config = transformers.GemmaConfig(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64)
    model = random_model("GemmaForCausalLM", config)
    path = write_gguf(tmp_path / "g.gguf", model, arch="gemma", vocab=vocab)
    ids = ids_for(len(vocab["tokens"]))
    ours, theirs = original_pair(path, model, ids)
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize("softcaps", [(50.0, 30.0), (5.0, 3.0)])
def test_gemma2_matches_transformers(tmp_path, vocabs, softcaps):
    """Gemma 2: four norms a layer (llama.cpp's ffn_norm is the pre-feed-forward one), soft-capped
    scores and logits, sliding-window layers alternating with full ones. transformers' GGUF reader
    ignores the soft-cap keys (it keeps Gemma2Config's 50 and 30), so with other caps the reference
    is the original model, read back from an F32 file."""
    vocab = vocabs["llama"]
    config = transformers.Gemma2Config(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=256, query_pre_attn_scalar=256, intermediate_size=64,
        max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=softcaps[0],
        final_logit_softcapping=softcaps[1])
    model = random_model("Gemma2ForCausalLM", config)
    ids = ids_for(len(vocab["tokens"]))  # 11 tokens: past the window of 4
    if softcaps == (50.0, 30.0):
        path = write_gguf(tmp_path / "g2.gguf", model, arch="gemma2", vocab=vocab, types={"attn_q.weight": "Q8_0"})
        ours, theirs = logits_pair(path, ids)
    else:
        path = write_gguf(tmp_path / "g2.gguf", model, arch="gemma2", vocab=vocab)
        ours, theirs = original_pair(path, model, ids)
    assert (ours - theirs).abs().max() <= ATOL


@pytest.mark.parametrize("full_rope", [None, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}])
def test_gemma3_matches_transformers(tmp_path, vocabs, full_rope):
    """Gemma 3: norms on each q and k head (stored + 1 like the others), five sliding layers to one
    full one with their own rotary base, and a linear scaling of the full layers' rotary angles
    (which transformers' GGUF reader ignores: that case is checked against the original model)."""
    vocab = vocabs["llama"]
    ropes = {} if full_rope is None else {"rope_parameters": {
        "full_attention": full_rope, "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}
    config = transformers.Gemma3TextConfig(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=256, intermediate_size=64, max_position_embeddings=64, sliding_window=4,
        **ropes)
    model = random_model("Gemma3ForCausalLM", config)
    ids = ids_for(len(vocab["tokens"]))  # 11 tokens: past the window of 4
    if full_rope is None:
        path = write_gguf(tmp_path / "g3.gguf", model, arch="gemma3", vocab=vocab, types={"attn_v.weight": "Q8_0"})
        ours, theirs = logits_pair(path, ids)
    else:
        path = write_gguf(tmp_path / "g3.gguf", model, arch="gemma3", vocab=vocab)
        ours, theirs = original_pair(path, model, ids)
    assert (ours - theirs).abs().max() <= ATOL


def test_olmo2_gives_back_the_original_model(tmp_path, vocabs):
    """OLMo 2 (norms after each sublayer, q/k norms across heads, no permutation): transformers has
    no GGUF reader for it, so the reference is the original model, read back from an F32 file."""
    vocab = vocabs["gpt2"]
    config = transformers.Olmo2Config(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    model = random_model("Olmo2ForCausalLM", config)
    path = write_gguf(tmp_path / "o.gguf", model, arch="olmo2", vocab=vocab)
    ids = ids_for(len(vocab["tokens"]))
    ours, theirs = original_pair(path, model, ids)
    assert (ours - theirs).abs().max() <= 1e-5


def test_phi3_matches_transformers(tmp_path, vocabs):
    """Phi-3: the fused qkv and gate_up matrices pass through under their own names; its tokenizer
    always puts "▁" first, even before a leading space."""
    vocab = dict(vocabs["llama"], pad=0)  # else transformers keeps Phi3Config's pad id 32000, past this vocabulary
    config = transformers.Phi3Config(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
        tie_word_embeddings=False)
    model = random_model("Phi3ForCausalLM", config)
    path = write_gguf(tmp_path / "p.gguf", model, arch="phi3", vocab=vocab, types={"attn_qkv.weight": "Q8_0"})
    ours, theirs = logits_pair(path, ids_for(len(vocab["tokens"])))
    assert (ours - theirs).abs().max() <= ATOL
    tokenizer = gguf_tokenizer(path)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        assert tokenizer.encode(text) == reference(text).input_ids, text


@pytest.mark.parametrize("style, pre", [("gpt2", "default"), ("gpt2", "llama-bpe"), ("gpt2", "qwen2"),
                                        ("llama", "default")])
def test_tokenizer_matches_transformers(tmp_path, vocabs, style, pre):
    """Byte-level BPE cut as GPT-2, Llama 3 or Qwen 2 cut text; SentencePiece-style BPE."""
    vocab = dict(vocabs[style], pre=pre)
    model = tiny_llama(len(vocab["tokens"]))
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama", vocab=vocab, default="F16")
    ours = gguf_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    # special ids and the chat template as the file states them (gguf_files writes these)
    assert (ours.bos_id, ours.eos_id) == (vocab["bos"], vocab["eos"])
    assert ours.pad_id == vocab["pad"] and ours.unk_id == vocab["unk"]
    assert ours.chat_template == CHAT_TEMPLATE
    assert ours.vocab_size == len(vocab["tokens"])


def test_add_bos_and_eos_flags_wrap_every_text(tmp_path, vocabs):
    import gguf

    vocab = vocabs["gpt2"]
    flags = {"tokenizer.ggml.add_bos_token": (True, gguf.GGUFValueType.BOOL),
             "tokenizer.ggml.add_eos_token": (True, gguf.GGUFValueType.BOOL)}
    path = write_gguf(tmp_path / "m.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab, extra=flags)
    tokenizer = gguf_tokenizer(path)
    plain = tokenizer.encode("Hello world", add_special_tokens=False)
    assert tokenizer.encode("Hello world") == [vocab["bos"], *plain, vocab["eos"]]


def test_gemma_tokenizer_matches_transformers(tmp_path, vocabs):
    """Gemma files spell a token of spaces with real spaces and rank merges by token order, not by
    score; no space is put before the text (add_space_prefix false)."""
    base = vocabs["llama"]
    n = len(base["tokens"]) + 2
    scores = base["scores"][:259] + (torch.rand(n - 259, generator=torch.Generator().manual_seed(0)) * -100).tolist()
    vocab = dict(base, tokens=base["tokens"] + ["  ", "   "], types=base["types"] + [1, 1], scores=scores)
    config = transformers.Gemma2Config(
        vocab_size=n, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=256, intermediate_size=64, max_position_embeddings=64, sliding_window=4)
    path = write_gguf(tmp_path / "g.gguf", transformers.Gemma2ForCausalLM(config), arch="gemma2", vocab=vocab)
    ours = gguf_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS + ["a    b  c"]:
        assert ours.encode(text) == theirs(text).input_ids, text
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == text, text


def test_digit_splitting_pre_tokenizer_follows_llama_cpp(tmp_path, vocabs):
    """tokenizer.ggml.pre = "smollm" (as SmolLM's own tokenizer.json does, and llama.cpp) cuts every
    digit off before BPE, so no merge joins two digits, although this vocabulary has such merges
    (transformers' GGUF reader knows no "smollm" and would join them)."""
    text = "year 2024, 3.14 and 42"
    pieces = {}
    for pre in ("smollm", "default"):
        vocab = dict(vocabs["gpt2"], pre=pre)
        path = write_gguf(tmp_path / f"{pre}.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab)
        pieces[pre] = [p for p in gguf_tokenizer(path).tokens(text) if any(c.isdigit() for c in p)]
    assert any(len(p) > 1 for p in pieces["default"])  # GPT-2's split lets this vocabulary join digits
    assert pieces["smollm"] == list("2024314" "42")


def test_from_pretrained_opens_a_gguf_file_or_its_folder(tmp_path, vocabs):
    """The resolver's way in: a .gguf path or a folder holding one gives the model, its tokenizer
    attached; dtype converts every tensor."""
    import anatomy

    vocab = vocabs["gpt2"]
    path = write_gguf(tmp_path / "m.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab, default="Q8_0")
    ids = ids_for(len(vocab["tokens"]))
    by_file, by_folder = anatomy.from_pretrained(path), anatomy.from_pretrained(tmp_path)
    half = anatomy.from_pretrained(path, dtype=torch.bfloat16)
    assert by_file.tokenizer.encode(TEXTS[0]) == gguf_tokenizer(path).encode(TEXTS[0])
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        full = by_file(ids).logits
        assert torch.equal(by_folder(ids).logits, full)
        assert (half(ids).logits.float() - full).abs().max() <= 0.1 * full.abs().max()
    (tmp_path / "other.gguf").write_bytes(path.read_bytes())
    with pytest.raises(CheckpointError, match=r"holds 2 .gguf files; give the file itself"):
        load_gguf(tmp_path)


def test_parity_pairs_every_intermediate_with_transformers_gguf_loader(tmp_path, vocabs):
    """`anatomy parity model.gguf`: each layer's hidden state and attention pattern, not only the logits."""
    from anatomy.checkpoints.parity import parity_rows

    vocab = vocabs["llama"]
    path = write_gguf(tmp_path / "m.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab, types=MIXED)
    rows = parity_rows(path, texts=TEXTS[:2], pad=True, tol=ATOL)
    assert {r.name for r in rows} >= {"blocks.0.resid_post", "blocks.1.attn.pattern", "final_norm.out", "logits"}
    assert all(r.ok for r in rows), [(r.name, r.max_abs_diff) for r in rows if not r.ok]


# bad input -----------------------------------------------------------------------------------------
def test_unsupported_architecture_is_named(tmp_path, vocabs):
    import gguf

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"mamba.gguf.*'mamba'.*anatomy reads: .*llama"):
        load_gguf(path)


def test_llama3_frequency_factors_are_refused_with_the_reason(tmp_path, vocabs):
    vocab = vocabs["gpt2"]
    factors = {"rope_freqs.weight": np.linspace(1.0, 8.0, 4, dtype=np.float32)}
    path = write_gguf(tmp_path / "l31.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab,
                      extra_tensors=factors)
    with pytest.raises(CheckpointError, match=r"l31.gguf.*rope_freqs.weight.*llama3.*Hugging Face folder"):
        load_gguf(path)


def test_unsupported_quant_type_is_named_before_loading(tmp_path, vocabs):
    vocab = vocabs["gpt2"]
    assert "Q8_K" not in supported_types()  # llama.cpp's internal type: gguf has no dequantizer for it
    path = write_gguf(tmp_path / "q8k.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab,
                      types={"ffn_down.weight": "Q8_K"})
    with pytest.raises(CheckpointError, match=r"q8k.gguf.*Q8_K.*readable types: .*Q4_K"):
        load_gguf(path)


@pytest.mark.parametrize("keep", [0.6, 0.002])
def test_truncated_file_is_named(tmp_path, vocabs, keep):
    vocab = vocabs["gpt2"]
    path = write_gguf(tmp_path / "whole.gguf", tiny_llama(len(vocab["tokens"])), arch="llama", vocab=vocab)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"cut.gguf.*truncated"):
        load_gguf(cut)
    with pytest.raises(CheckpointError, match=r"cut.gguf"):
        gguf_tokenizer(cut)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # gguf quantizing the NaN block
def test_non_finite_weights_are_named(tmp_path, vocabs):
    vocab = vocabs["gpt2"]
    model = tiny_llama(len(vocab["tokens"]))
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] = float("nan")
    path = write_gguf(tmp_path / "nan.gguf", model, arch="llama", vocab=vocab, types={"ffn_up.weight": "Q8_0"})
    with pytest.raises(CheckpointError, match=r"nan.gguf[\s\S]*model.layers.1.mlp.up_proj.weight \(32 NaN"):
        load_gguf(path)


def test_not_a_gguf_file_is_named(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model")
    with pytest.raises(CheckpointError, match=r"notes.gguf.*is not a GGUF file"):
        load_gguf(path)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        load_gguf(tmp_path / "missing.gguf")
