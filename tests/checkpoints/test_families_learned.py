"""Model types with learned, relative or sinusoidal positions (issue 12): each equals transformers.

For every case, a tiny random transformers model (hidden 32, 2 layers, vocab 99) saved with
save_pretrained and read by anatomy.from_pretrained:
- every intermediate the parity report pairs is within 1e-5 in float32, padded and unpadded;
- anatomy's save_pretrained writes the same tensors back, and transformers computes the same logits;
- decoders and encoder-decoders: the KV cache gives the logits of the full pass, and greedy
  generation picks the tokens transformers' generate picks.
"""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_cases import VOCAB, assert_written_back, checkpoint_factory, load_theirs, random_ids

import anatomy
from anatomy.checkpoints.parity import parity_rows

TOL = 1e-5
PAD = VOCAB - 1

BERT_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=64)
DISTILBERT_SIZES = dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64)
BART_SIZES = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
OPT_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
                 max_position_embeddings=64, pad_token_id=1, bos_token_id=2, eos_token_id=2)
GPT_NEO_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
                     attention_types=[[["global", "local"], 1]], window_size=3, bos_token_id=0, eos_token_id=0)
# relative_attention_max_distance 8 and 8 buckets: the test's 7 tokens reach the log-spaced buckets
T5_SIZES = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=8, pad_token_id=0, eos_token_id=1,
                decoder_start_token_id=0)
# case -> (transformers class, config class, config fields)
CASES = {
    "marian-uneven": ("MarianMTModel", "MarianConfig", dict(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=32, encoder_layers=3, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=29,
        max_position_embeddings=64, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=0,
        forced_eos_token_id=0, scale_embedding=True, activation_function="swish")),
    "roberta-mlm": ("RobertaForMaskedLM", "RobertaConfig", dict(BERT_SIZES, pad_token_id=1)),
    "roberta-classify": ("RobertaForSequenceClassification", "RobertaConfig",
                         dict(BERT_SIZES, pad_token_id=3, num_labels=3, type_vocab_size=2)),
    "roberta-base": ("RobertaModel", "RobertaConfig", dict(BERT_SIZES, pad_token_id=1, hidden_act="gelu_new")),
    "distilbert-mlm": ("DistilBertForMaskedLM", "DistilBertConfig", dict(DISTILBERT_SIZES, pad_token_id=0)),
    "distilbert-classify": ("DistilBertForSequenceClassification", "DistilBertConfig",
                            dict(DISTILBERT_SIZES, num_labels=3, activation="relu")),
    "distilbert-tokens": ("DistilBertForTokenClassification", "DistilBertConfig", dict(DISTILBERT_SIZES, num_labels=5)),
    "distilbert-base": ("DistilBertModel", "DistilBertConfig", dict(DISTILBERT_SIZES)),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(BART_SIZES)),
    "bart-uneven": ("BartForConditionalGeneration", "BartConfig", dict(
        BART_SIZES, encoder_layers=1, decoder_layers=3, decoder_attention_heads=2, decoder_ffn_dim=29,
        scale_embedding=True, activation_function="relu")),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(OPT_SIZES)),
    "opt-350m-like": ("OPTForCausalLM", "OPTConfig", dict(OPT_SIZES, word_embed_proj_dim=16, do_layer_norm_before=False,
                                                          enable_bias=False, activation_function="gelu")),
    "opt-base": ("OPTModel", "OPTConfig", dict(OPT_SIZES)),
    # window_size 3 < the 7 tokens of the tests: the local layers see less than the global ones
    "gpt_neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(GPT_NEO_SIZES)),
    "gpt_neo-local-first": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(
        GPT_NEO_SIZES, num_layers=3, attention_types=[[["local"], 2], [["global"], 1]], intermediate_size=48,
        tie_word_embeddings=False)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(T5_SIZES)),
    # Flan-T5's shape: gated-gelu, a head of its own (not rescaled), here also a deeper decoder
    "flan-t5-like": ("T5ForConditionalGeneration", "T5Config", dict(
        T5_SIZES, feed_forward_proj="gated-gelu", num_decoder_layers=3, tie_word_embeddings=False, _untie_head=True)),
    "t5-encoder": ("T5EncoderModel", "T5Config", dict(T5_SIZES, feed_forward_proj="gated-gelu")),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(case) -> the folder of a saved random transformers model (built once per module)."""
    return checkpoint_factory(CASES, tmp_path_factory)


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_intermediate_matches_transformers(checkpoint, case, pad):
    rows = parity_rows(checkpoint(case), pad=pad, tol=TOL)
    names = [r.name for r in rows]
    assert sum(".attn.pattern" in n for n in names) >= 2  # and one hidden state per layer, at least
    assert sum("resid" in n or "final_norm" in n or "project_out" in n for n in names) >= 3
    assert "logits" in names or CASES[case][0].endswith("Model")
    bad = [(r.name, r.reference, r.max_abs_diff) for r in rows if not r.ok]
    assert not bad, f"beyond {TOL}: {bad}"


def _logits(model, case, ids, mask, tgt):
    with torch.no_grad():
        if tgt is not None:
            out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt)
        else:
            out = model(input_ids=ids, attention_mask=mask)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("case", list(CASES))
def test_save_pretrained_gives_transformers_the_same_model(checkpoint, tmp_path, case):
    source = checkpoint(case)
    model = anatomy.from_pretrained(source)
    saved = model.save_pretrained(tmp_path / "saved", format="hf")
    assert_written_back(source, saved, CASES[case][0])
    ids, mask = random_ids((2, 7)), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    tgt = random_ids((2, 4), seed=2) if model.config.arch == "encoder-decoder" else None
    reference = _logits(load_theirs(CASES[case][0], source), case, ids, mask, tgt)
    assert torch.equal(_logits(load_theirs(CASES[case][0], saved), case, ids, mask, tgt), reference)


def _generating(case: str) -> bool:
    return CASES[case][0].endswith(("ForCausalLM", "LMHeadModel", "MTModel", "ConditionalGeneration"))


@pytest.mark.parametrize("case", [c for c in CASES if _generating(c)])
def test_the_kv_cache_gives_the_full_pass(checkpoint, case):
    model = anatomy.from_pretrained(checkpoint(case))
    ids = random_ids((2, 7))
    with torch.no_grad():
        if model.config.arch == "encoder-decoder":
            src = random_ids((2, 6), seed=3)
            memory = model.encode(src)
            _, full = model.decode(ids, memory)
            cache = model.new_cache()
            steps = [model.decode(ids[:, :3], memory, cache=cache)[1]]
            steps += [model.decode(ids[:, t:t + 1], memory, cache=cache)[1] for t in range(3, 7)]
        else:
            full = model(ids).logits
            cache = model.new_cache()
            steps = [model(ids[:, :3], cache=cache).logits]
            steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=TOL)


@pytest.mark.parametrize("case", [c for c in CASES if _generating(c)])
def test_greedy_generation_equals_transformers(checkpoint, case):
    directory = checkpoint(case)
    model, theirs = anatomy.from_pretrained(directory), load_theirs(CASES[case][0], directory)
    prompt = random_ids((2, 5))
    # transformers' own cache is not under test (and its T5 cache breaks with a decoder deeper than the encoder)
    no_stop = dict(do_sample=False, num_beams=1, eos_token_id=None, forced_eos_token_id=None,
                   pad_token_id=PAD, max_new_tokens=8, use_cache=False)
    with torch.no_grad():
        if model.config.arch == "encoder-decoder":
            expected = theirs.generate(input_ids=prompt, decoder_start_token_id=model.config.decoder_start_token_id,
                                       **no_stop)
            ours = anatomy.generate(model, src_ids=prompt, max_new_tokens=8).sequences
            assert torch.equal(ours, expected)
            # Sources of different lengths: the second one padded at the end.
            prompt[1, 3:], mask = PAD, torch.ones_like(prompt, dtype=torch.bool)
            mask[1, 3:] = False
            expected = theirs.generate(input_ids=prompt, attention_mask=mask.long(),
                                       decoder_start_token_id=model.config.decoder_start_token_id, **no_stop)
            ours = anatomy.generate(model, src_ids=prompt, src_padding_mask=mask, max_new_tokens=8).sequences
        else:
            expected = theirs.generate(input_ids=prompt, **no_stop)
            ours = anatomy.generate(model, prompt, max_new_tokens=8).sequences
            assert torch.equal(ours, expected)
            # A batch of prompts of different lengths, left-padded.
            prompt[1, :2], mask = PAD, torch.ones_like(prompt, dtype=torch.bool)
            mask[1, :2] = False
            expected = theirs.generate(input_ids=prompt, attention_mask=mask.long(), **no_stop)
            ours = anatomy.generate(model, prompt, padding_mask=mask, max_new_tokens=8).sequences
    assert torch.equal(ours, expected)


def test_decoder_sizes_are_validated_and_belong_to_encoder_decoders():
    config = anatomy.ModelConfig(arch="encoder-decoder", d_model=32, n_heads=4, n_layers=3, d_ff=40,
                                 decoder_n_layers=1, decoder_n_heads=2)
    decoder = config.decoder_config()
    assert (decoder.n_layers, decoder.n_heads, decoder.d_head, decoder.d_ff) == (1, 2, 16, 40)
    assert anatomy.build_model(config).new_cache().n_layers == 1
    with pytest.raises(anatomy.ConfigError, match="decoder stack.*divisible by n_heads=5"):
        config.replace(decoder_n_heads=5)
    with pytest.raises(anatomy.ConfigError, match="decoder_n_layers=2 needs arch='encoder-decoder'"):
        anatomy.ModelConfig(arch="decoder", decoder_n_layers=2)


def test_positions_count_real_tokens_under_left_padding(checkpoint):
    """RoBERTa numbers positions from the padding: a left-padded row gives transformers' logits."""
    directory = checkpoint("roberta-mlm")
    model, theirs = anatomy.from_pretrained(directory), load_theirs(CASES["roberta-mlm"][0], directory)
    ids = random_ids((2, 6))
    ids[1, :2] = model.config.pad_token_id  # row 1: two pads, then four real tokens
    mask = ids != model.config.pad_token_id
    with torch.no_grad():
        ours = model(ids, padding_mask=mask).logits
        reference = theirs(input_ids=ids, attention_mask=mask.long()).logits
    assert (ours - reference)[mask].abs().max() <= TOL


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_relative_position_buckets_are_t5s(bidirectional):
    """Every distance from -300 to 300 falls in the bucket transformers' T5 gives it."""
    transformers = pytest.importorskip("transformers")
    from anatomy.positional import relative_position_bucket

    distance = torch.arange(-300, 301)
    for n_buckets, max_distance in [(32, 128), (8, 8), (16, 40)]:
        theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            distance, bidirectional=bidirectional, num_buckets=n_buckets, max_distance=max_distance)
        ours = relative_position_bucket(distance, bidirectional=bidirectional, n_buckets=n_buckets,
                                        max_distance=max_distance)
        assert torch.equal(ours, theirs)


FROM_SCRATCH = ["marian-uneven", "roberta-mlm", "roberta-classify", "distilbert-mlm", "distilbert-classify",
                "bart-uneven", "opt-350m-like", "gpt_neo", "t5", "flan-t5-like", "t5-encoder"]


@pytest.mark.parametrize("case", FROM_SCRATCH)
def test_a_config_built_from_scratch_is_written_as_its_own_type(checkpoint, tmp_path, case):
    """A model anatomy builds (no checkpoint behind it) is saved as the model type its flags
    describe, and transformers computes what anatomy does."""
    import transformers

    loaded = anatomy.from_pretrained(checkpoint(case)).config
    config = anatomy.ModelConfig.from_dict({**loaded.to_dict(), "extra": {}})
    model = anatomy.build_model(config, seed=0).eval()
    model.save_pretrained(tmp_path, format="hf")
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == loaded.extra["hf_config"]["model_type"]
    theirs = getattr(transformers, written["architectures"][0]).from_pretrained(tmp_path).eval()
    ids, mask = random_ids((2, 7)), torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            tgt = random_ids((2, 4), seed=2)
            ours, reference = model(ids, tgt, mask).logits, _logits(theirs, case, ids, mask.long(), tgt)
            keep = torch.ones(2, 4, dtype=torch.bool)
        else:
            out = model(ids, padding_mask=mask)
            ours = out.logits if out.logits is not None else out.last_hidden_state
            reference, keep = _logits(theirs, case, ids, mask.long(), None), mask
    if ours.dim() == 2:  # sequence classification: one row per text
        keep = torch.ones(2, dtype=torch.bool)
    assert (ours - reference)[keep].abs().max() <= TOL


def test_decoder_sizes_survive_a_json_round_trip():
    """Written out, every derived field becomes explicit; the decoder's heads must still be its own."""
    config = anatomy.ModelConfig(arch="encoder-decoder", d_model=32, n_heads=4, n_layers=3, decoder_n_layers=1,
                                 decoder_n_heads=2)
    again = anatomy.ModelConfig.from_json(config.to_json())
    assert again == config
    assert again.decoder_config().d_head == config.decoder_config().d_head == 16
    assert again.decoder_config().layer_types == ("full",)


@pytest.mark.parametrize("case", ["t5", "flan-t5-like", "t5-encoder", "opt-350m-like", "gpt_neo", "roberta-mlm", "bart-uneven"])
def test_the_walkthrough_recomputes_every_step(checkpoint, case):
    """anatomy walk's float64 recomputation (relative bias, unscaled scores, projections, rescaled
    head included) matches the model's own tensors at every step."""
    from anatomy.walk import walkthrough

    model = anatomy.from_pretrained(checkpoint(case))
    target = random_ids((4,), seed=2).tolist() if model.config.arch == "encoder-decoder" else None
    walk = walkthrough(model, random_ids((6,)).tolist(), target_ids=target)
    assert walk.ok, [step.title for step in walk.failures]
