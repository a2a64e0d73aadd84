"""Generation: each strategy does what its definition says, with or without the cache."""

import itertools
import math

import pytest
import torch

import anatomy
from anatomy import ModelConfig
from anatomy.generation import generate, sampling_distribution, top_k_filter, top_p_filter
from generation_cases import decoder, ids, seq2seq, sequence_log_prob

# The cache changes the cost, never the tokens --------------------------------------------------

@pytest.mark.parametrize("pos", ["learned", "rotary", "alibi"])
def test_cache_and_no_cache_give_the_same_greedy_tokens(pos):
    model = decoder(pos_encoding=pos)
    prompt = ids(2, 4)
    with_cache = generate(model, prompt, max_new_tokens=10)
    without = generate(model, prompt, max_new_tokens=10, use_cache=False)
    assert torch.equal(with_cache.sequences, without.sequences)
    torch.testing.assert_close(with_cache.scores, without.scores, atol=1e-4, rtol=1e-4)


def test_cache_and_no_cache_give_the_same_samples():
    model = decoder(pos_encoding="rotary", n_kv_heads=2)
    prompt = ids(3, 4)
    kwargs = dict(max_new_tokens=10, strategy="sample", temperature=1.5, top_k=8, top_p=0.95, seed=7)
    assert torch.equal(generate(model, prompt, **kwargs).sequences,
                       generate(model, prompt, use_cache=False, **kwargs).sequences)


def test_greedy_picks_the_argmax_at_every_step():
    model = decoder()
    out = generate(model, ids(1, 3), max_new_tokens=6)
    with torch.no_grad():
        logits = model(out.sequences).logits  # (1, T, V)
    predicted = logits[0, out.prompt_length - 1:-1].argmax(-1)
    assert torch.equal(predicted, out.new_tokens[0])
    log_p = torch.log_softmax(logits[0, out.prompt_length - 1:-1], -1).gather(1, predicted[:, None]).sum()
    torch.testing.assert_close(out.scores[0], log_p, atol=1e-4, rtol=1e-4)


# Sampling --------------------------------------------------------------------------------------

def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.1, 0.45, 0.05, 0.25, 0.15])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p)).nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.3) == [1]  # 0.45 >= 0.3 alone
    assert kept(0.6) == [1, 3]  # 0.45 + 0.25 = 0.70 >= 0.6
    assert kept(0.8) == [1, 3, 4]  # 0.85
    assert kept(0.9) == [0, 1, 3, 4]  # 0.95
    assert kept(1.0) == [0, 1, 2, 3, 4]
    # the property itself, on random rows: the kept set reaches p, and is the smallest that does
    rows = torch.randn(50, 20, generator=torch.Generator().manual_seed(0)) * 3
    for p in (0.2, 0.5, 0.9):
        filtered = top_p_filter(rows, p)
        for row, out in zip(rows.softmax(-1), filtered):
            keep = torch.isfinite(out)
            assert row[keep].sum() >= p - 1e-6
            assert row[keep].sum() - row[keep].min() < p  # dropping the least likely kept token falls short
            assert (~keep).all() or row[keep].min() >= row[~keep].max()  # the kept are the most probable


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5, 0.3]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True, False]]
    assert torch.isfinite(top_k_filter(logits, 99)).all()
    probs = sampling_distribution(logits, temperature=0.5, top_k=2)
    torch.testing.assert_close(probs[0, [1, 3]], torch.softmax(logits[0, [1, 3]] / 0.5, -1))


def test_extreme_temperatures_reach_their_limits_without_nan():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5, 0.3], [80.0, -50.0, 79.0, 0.0, -math.inf]])
    coldest = sampling_distribution(logits, temperature=1e-300)  # T -> 0: the argmax, not inf / inf
    assert torch.equal(coldest, torch.nn.functional.one_hot(logits.argmax(-1), 5).float())
    hottest = sampling_distribution(logits[:1], temperature=1e300)  # T -> inf: uniform
    torch.testing.assert_close(hottest, torch.full((1, 5), 0.2))
    torch.testing.assert_close(sampling_distribution(logits, temperature=0.7), torch.softmax(logits / 0.7, -1))


def test_top_k_one_is_greedy():
    model = decoder()
    prompt = ids(2, 3)
    sampled = generate(model, prompt, max_new_tokens=8, strategy="sample", top_k=1, seed=0)
    assert torch.equal(sampled.sequences, generate(model, prompt, max_new_tokens=8).sequences)


def test_seeds_reproduce_and_differ_without_touching_the_global_rng():
    model = decoder()
    prompt = ids(1, 3)
    kwargs = dict(max_new_tokens=12, strategy="sample", temperature=2.0)
    state = torch.get_rng_state()
    first = generate(model, prompt, seed=1, **kwargs)
    assert torch.equal(first.sequences, generate(model, prompt, seed=1, **kwargs).sequences)
    assert not torch.equal(first.sequences, generate(model, prompt, seed=2, **kwargs).sequences)
    generator = torch.Generator().manual_seed(1)
    assert torch.equal(first.sequences, generate(model, prompt, generator=generator, **kwargs).sequences)
    unseeded = generate(model, prompt, **kwargs)  # a fresh seed, reported so the run can be repeated
    assert torch.equal(unseeded.sequences, generate(model, prompt, seed=unseeded.seed, **kwargs).sequences)
    assert torch.equal(torch.get_rng_state(), state)


# Beam search -----------------------------------------------------------------------------------

def test_one_beam_is_greedy():
    model = decoder()
    prompt = ids(2, 3)
    beam = generate(model, prompt, max_new_tokens=8, strategy="beam", num_beams=1)
    assert torch.equal(beam.sequences, generate(model, prompt, max_new_tokens=8).sequences)


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_equals_exhaustive_search(use_cache):
    """Vocabulary 4, 3 new tokens: with 16 beams nothing is pruned that could win."""
    model = decoder(vocab_size=4, pos_encoding="rotary")
    every = torch.tensor(list(itertools.product(range(4), repeat=3)))  # (64, 3)
    for seed in range(4):
        prompt = ids(1, 2, seed=seed, vocab=4)
        log_p = sequence_log_prob(model, prompt[0], every)
        beam = generate(model, prompt, max_new_tokens=3, num_beams=16, use_cache=use_cache)
        greedy = generate(model, prompt, max_new_tokens=3)
        assert torch.equal(beam.new_tokens[0], every[log_p.argmax()])
        torch.testing.assert_close(beam.scores[0], log_p.max() / 3, atol=1e-5, rtol=1e-5)
        assert beam.scores[0] * 3 >= greedy.scores[0] - 1e-5


def bigram_model(table):
    """A decoder that is exactly the bigram model p(next = j | current = i) = table[i, j].

    Embeddings are one-hot, every sublayer's output projection is zero (so the residual stream is
    just the current token's one-hot vector), no final norm, and the LM head holds log table^T.
    """
    vocab = table.size(0)
    config = ModelConfig(arch="decoder", vocab_size=vocab, d_model=vocab, n_heads=1, n_layers=1, d_ff=4,
                         max_seq_len=16, pos_encoding="none", final_norm=False, tie_embeddings=False)
    model = anatomy.build_model(config, seed=0).eval()
    with torch.no_grad():
        model.token_embedding.weight.copy_(torch.eye(vocab))
        for linear in (model.blocks[0].attn.o_proj, model.blocks[0].mlp.fc_out):
            linear.weight.zero_()
            linear.bias.zero_()
        model.lm_head.proj.weight.copy_(table.log().T)
    return model


def test_beam_search_beats_greedy_where_the_best_first_token_is_a_trap():
    """From token 0, greedy takes 1 (p 0.5), after which everything is uniform: 0.5 * 0.25 = 0.125.
    Starting with 2 (p 0.4) leads to 3 with p 0.99: 0.4 * 0.99 = 0.396. Two beams find it."""
    table = torch.tensor([[0.02, 0.50, 0.40, 0.08],
                          [0.25, 0.25, 0.25, 0.25],
                          [0.005, 0.0025, 0.0025, 0.99],
                          [0.25, 0.25, 0.25, 0.25]])
    model = bigram_model(table)
    start = torch.tensor([[0]])
    greedy = generate(model, start, max_new_tokens=2)
    beam = generate(model, start, max_new_tokens=2, num_beams=2, length_penalty=0.0)
    assert greedy.new_tokens.tolist()[0][0] == 1
    assert beam.new_tokens.tolist() == [[2, 3]]
    torch.testing.assert_close(beam.scores, torch.tensor([0.396]).log())
    assert beam.scores[0] > greedy.scores[0]


def test_beam_search_with_a_stop_token_equals_exhaustive_search():
    """Hypotheses end at the stop token (3) or at 3 new tokens; ranked by log p / length^alpha."""
    model = decoder(vocab_size=4, pos_encoding="learned")
    stop = 3
    by_length = {n: torch.tensor([h for h in itertools.product(range(4), repeat=n)
                                  if stop not in h[:-1] and (n == 3 or h[-1] == stop)]) for n in (1, 2, 3)}
    for seed in range(3):
        prompt = ids(1, 2, seed=seed, vocab=4)
        log_p = {n: sequence_log_prob(model, prompt[0], hyps) for n, hyps in by_length.items()}
        for length_penalty in (0.0, 1.0, 2.0):
            score, n, i = max((float(s) / n ** length_penalty, n, i) for n in log_p for i, s in enumerate(log_p[n]))
            best = tuple(by_length[n][i].tolist())
            beam = generate(model, prompt, max_new_tokens=3, num_beams=16, stop_tokens=stop,
                            length_penalty=length_penalty, pad_token_id=0)
            length = int(beam.padding_mask[0].sum()) - beam.prompt_length
            assert tuple(beam.new_tokens[0, :length].tolist()) == best
            assert beam.scores[0].item() == pytest.approx(score, abs=1e-5)
            assert bool(beam.finished[0]) == (best[-1] == stop)


def test_beam_search_batch_equals_each_prompt_alone():
    model = decoder(pos_encoding="rotary")
    prompts = [torch.tensor([[5, 1, 7, 2]]), torch.tensor([[9, 4]])]
    batch = torch.tensor([[5, 1, 7, 2], [0, 0, 9, 4]])
    mask = torch.tensor([[True] * 4, [False, False, True, True]])
    kwargs = dict(max_new_tokens=6, num_beams=3, stop_tokens=[11], pad_token_id=0)
    together = generate(model, batch, padding_mask=mask, **kwargs)
    for row, prompt in enumerate(prompts):
        alone = generate(model, prompt, **kwargs)
        n = alone.new_tokens.size(1)
        assert torch.equal(together.new_tokens[row, :n], alone.new_tokens[0])
        torch.testing.assert_close(together.scores[row], alone.scores[0], atol=1e-5, rtol=1e-5)


# Stopping, padding, batching -------------------------------------------------------------------

def test_stop_tokens_end_a_row_and_pad_the_rest():
    model = decoder()
    prompt = ids(2, 3, seed=5)
    free = generate(model, prompt, max_new_tokens=8)
    stop = int(free.new_tokens[0, 2])  # row 0's third new token
    stopped = generate(model, prompt, max_new_tokens=8, stop_tokens=[stop], pad_token_id=0)
    first = (free.new_tokens[0] == stop).nonzero()[0, 0].item()
    assert torch.equal(stopped.new_tokens[0, :first + 1], free.new_tokens[0, :first + 1])
    assert (stopped.new_tokens[0, first + 1:] == 0).all()
    assert stopped.finished[0]
    assert stopped.padding_mask[0, 3:].tolist() == [i <= first for i in range(stopped.new_tokens.size(1))]
    ended = (free.new_tokens[1] == stop).any()
    assert bool(stopped.finished[1]) == bool(ended)
    if not ended:  # the other row runs to max_new_tokens
        assert torch.equal(stopped.new_tokens[1], free.new_tokens[1])


def test_generation_ends_when_every_row_has_stopped():
    model = decoder()
    prompt = ids(1, 3)
    first = int(generate(model, prompt, max_new_tokens=1).new_tokens[0, 0])
    out = generate(model, prompt, max_new_tokens=10, stop_tokens=first)
    assert out.new_tokens.tolist() == [[first]] and out.finished.all()


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary", "alibi"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_equals_each_row_alone(pos, use_cache):
    model = decoder(pos_encoding=pos)
    prompts = [[4, 8, 1, 5, 2], [7, 3], [12, 6, 9]]
    width = max(map(len, prompts))
    batch = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    together = generate(model, batch, padding_mask=mask, max_new_tokens=8, use_cache=use_cache)
    assert torch.equal(together.padding_mask[:, :width], mask)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=8)
        assert torch.equal(together.new_tokens[row], alone.new_tokens[0])
        torch.testing.assert_close(together.scores[row], alone.scores[0], atol=1e-5, rtol=1e-5)


def test_streamer_sees_every_token_as_it_is_chosen():
    model = decoder()
    seen = []
    out = generate(model, ids(2, 3), max_new_tokens=5, streamer=seen.append)
    assert torch.equal(torch.tensor(seen).T, out.new_tokens)


def test_model_mode_is_restored_and_dropout_is_off():
    model = decoder(dropout=0.5).train()
    prompt = ids(1, 3)
    first = generate(model, prompt, max_new_tokens=6)
    assert model.training
    assert torch.equal(first.sequences, generate(model, prompt, max_new_tokens=6).sequences)


# Encoder-decoder -------------------------------------------------------------------------------

def test_encoder_decoder_generation():
    model = seq2seq(pos_encoding="sinusoidal", n_kv_heads=2)
    src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    src_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    kwargs = dict(src_ids=src, src_padding_mask=src_mask, max_new_tokens=7, decoder_start_token_id=2)
    greedy = generate(model, **kwargs)
    assert greedy.prompt_length == 1 and (greedy.sequences[:, 0] == 2).all()
    assert torch.equal(greedy.sequences, generate(model, use_cache=False, **kwargs).sequences)
    alone = generate(model, src_ids=src[1:, :3], max_new_tokens=7, decoder_start_token_id=2)
    assert torch.equal(greedy.sequences[1], alone.sequences[0])  # source padding changes nothing
    # greedy = the argmax of the full teacher-forced pass at every position
    with torch.no_grad():
        logits = model(src, greedy.sequences, src_padding_mask=src_mask).logits
    assert torch.equal(logits[:, :-1].argmax(-1), greedy.sequences[:, 1:])
    beam = generate(model, num_beams=4, stop_tokens=3, **kwargs)
    one_beam = generate(model, num_beams=1, strategy="beam", **kwargs)
    assert torch.equal(one_beam.sequences, greedy.sequences)
    assert beam.sequences.size(0) == 2 and (beam.scores > -math.inf).all()
    sampled = generate(model, strategy="sample", seed=3, **kwargs)
    assert torch.equal(sampled.sequences, generate(model, strategy="sample", seed=3, use_cache=False,
                                                   **kwargs).sequences)


# Past the context the window slides --------------------------------------------------------------

def crop_and_recompute(model, prompt, n_new, window):
    """nanoGPT's loop, written out: the last `window` tokens, a full pass, the argmax, append."""
    sequence = prompt
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(sequence[:, -window:]).logits[:, -1]
            sequence = torch.cat([sequence, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return sequence


def test_a_char_lm_with_context_64_writes_500_tokens():
    model = decoder(vocab_size=65, max_seq_len=64)
    out = generate(model, ids(1, 10, vocab=65), max_new_tokens=500)
    assert out.new_tokens.shape == (1, 500) and out.window_slid
    assert not generate(model, ids(1, 10, vocab=65), max_new_tokens=54).window_slid  # 64 positions: no slide


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_length", [3, 12])  # 12: the prompt alone is longer than the context
def test_sliding_equals_a_manual_crop_and_recompute_loop(pos, use_cache, prompt_length):
    model = decoder(max_seq_len=8, pos_encoding=pos)
    prompt = ids(2, prompt_length)
    got = generate(model, prompt, max_new_tokens=20, use_cache=use_cache)
    assert torch.equal(got.sequences, crop_and_recompute(model, prompt, 20, window=8))


def test_encoder_decoder_slides_its_decoder_window():
    model = seq2seq(max_seq_len=8)
    src = ids(1, 5)
    got = generate(model, src_ids=src, decoder_start_token_id=1, max_new_tokens=15)
    memory = model.encode(src)
    sequence = torch.tensor([[1]])
    with torch.no_grad():
        for _ in range(15):
            _, logits = model.decode(sequence[:, -8:], memory)
            sequence = torch.cat([sequence, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(got.sequences, sequence) and got.window_slid


def test_beam_search_slides_too():
    out = generate(decoder(max_seq_len=8), ids(1, 3), max_new_tokens=12, num_beams=3)
    assert out.new_tokens.shape == (1, 12) and out.window_slid


# Parity with Hugging Face ------------------------------------------------------------------------

def hf_model_in_anatomy(model_class, config, directory):
    """A random-init transformers model, saved and loaded back by anatomy.from_pretrained."""
    pytest.importorskip("anatomy.checkpoints")
    torch.manual_seed(0)
    hf = model_class(config).eval()
    hf.save_pretrained(directory)
    return hf, anatomy.from_pretrained(directory)


def test_greedy_matches_transformers_gpt2_on_a_left_padded_batch(tmp_path):
    transformers = pytest.importorskip("transformers")
    # initializer_range 0.3, not 0.02: confident enough predictions that the tokens vary
    config = transformers.GPT2Config(vocab_size=50, n_positions=40, n_embd=32, n_layer=2, n_head=4,
                                     initializer_range=0.3, bos_token_id=49, eos_token_id=49)
    hf, model = hf_model_in_anatomy(transformers.GPT2LMHeadModel, config, tmp_path)
    prompt = torch.tensor([[0, 0, 3, 14, 15], [9, 26, 5, 35, 8]])
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    expected = hf.generate(prompt, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(model, prompt, padding_mask=mask, max_new_tokens=12).sequences, expected)


def test_greedy_matches_transformers_marian(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.MarianConfig(
        vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
        pad_token_id=39, decoder_start_token_id=39, eos_token_id=0, forced_eos_token_id=None, init_std=0.3)
    hf, model = hf_model_in_anatomy(transformers.MarianMTModel, config, tmp_path)
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 39]])
    src_mask = src != 39
    expected = hf.generate(input_ids=src, attention_mask=src_mask.long(), max_new_tokens=10, do_sample=False,
                           eos_token_id=None, bad_words_ids=None)
    # the start token comes from the loaded config.json (decoder_start_token_id=39)
    got = generate(model, src_ids=src, src_padding_mask=src_mask, max_new_tokens=10)
    assert torch.equal(got.sequences, expected)
