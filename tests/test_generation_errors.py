"""Generation's refusals: every bad argument named, the command line's one-line errors, and a
fuzz over the arguments (an answer or a ValueError that names the problem, nothing else)."""

import pytest
import torch

import anatomy
from anatomy import ModelConfig
from anatomy.generation import generate
from generation_cases import TINY, decoder, seq2seq

# Clear errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="sample", temperature=0.0), "temperature must be > 0"),
    (dict(strategy="sample", top_p=0.0), r"top_p must be None or a number in \(0, 1\]"),
    (dict(strategy="sample", top_p=1.5), r"top_p must be None or a number in \(0, 1\]"),
    (dict(strategy="sample", top_p=float("nan")), r"top_p must be None or a number in \(0, 1\]"),
    (dict(strategy="sample", temperature=float("nan")), "temperature must be a finite number"),
    (dict(strategy="sample", top_k=0), "top_k must be None or an integer >= 1"),
    (dict(num_beams=0), "num_beams must be an integer >= 1"),
    (dict(strategy="nucleus"), "allowed values: 'greedy', 'sample', 'beam'"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(max_new_tokens=10**12), r"needs about .* GB .* more than the .* GB available"),
    (dict(max_new_tokens=10**12, use_cache=False), r"needs about .* GB"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an integer >= 1, got 2.0"),
    (dict(temperature=0.7), "only apply to strategy='sample'"),
    (dict(stop_tokens=[13]), r"each of stop_tokens must be a token id in \[0, vocab_size=13\), got 13"),
    (dict(stop_tokens="2"), r"stop_tokens must be a token id or a list of token ids, got '2'"),
    (dict(stop_tokens=[2.0]), r"each of stop_tokens must be a token id"),
    (dict(pad_token_id=13), r"pad_token_id must be a token id in \[0, vocab_size=13\), got 13"),
    (dict(pad_token_id=-1, num_beams=2), r"pad_token_id must be a token id"),
    (dict(num_beams=2, length_penalty=float("nan")), "length_penalty must be a finite number, got nan"),
    (dict(num_beams=2, length_penalty=10**12), r"length_penalty must be in \[-10, 10\], got 1000000000000"),
    (dict(num_beams=2, length_penalty=-10.5), r"length_penalty must be in \[-10, 10\], got -10.5"),
    (dict(input_ids=torch.tensor([[1, 2]], dtype=torch.uint8)), r"input_ids .* dtype torch.long .* torch.uint8"),
    (dict(input_ids=torch.tensor([[1, 2]], dtype=torch.int8)), r"input_ids .* torch.int8"),
    (dict(input_ids=torch.tensor([[1, 2]], dtype=torch.int16)), r"input_ids .* torch.int16"),
    (dict(input_ids=torch.tensor([[1, 13]])), r"input_ids holds id 13, outside \[0, vocab_size=13\)"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "input_ids is empty"),
    (dict(use_cache="yes"), "use_cache must be True or False"),
    (dict(strategy="sample", seed=-1), r"seed must be an integer in \[0, 2\*\*64\)"),
    (dict(padding_mask=torch.tensor([[True, False]])), "left-padded"),
    (dict(num_beams=2, streamer=print), "streaming needs strategy"),
    (dict(input_ids=[[1, 2]]), r"input_ids must be a tensor of token ids \[batch, positions\]"),
])
def test_bad_arguments_raise_a_clear_error(kwargs, message):
    kwargs = {"input_ids": torch.tensor([[1, 2]]), **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(decoder(), **kwargs)


def test_nan_logits_are_refused_with_a_message():
    model = decoder()
    with torch.no_grad():
        model.token_embedding.weight[5].fill_(float("nan"))  # one corrupt row of the (tied) embedding
    with pytest.raises(ValueError, match="NaN logits at generation step 1"):
        generate(model, torch.tensor([[1, 5]]))


def test_alibi_refuses_a_cache_larger_than_memory_before_allocating():
    """ALiBi has no position table, so no window: 10**12 positions would be an 8 TB cache."""
    with pytest.raises(ValueError, match="lower max_new_tokens or num_beams"):
        generate(decoder(pos_encoding="alibi"), torch.tensor([[1, 2]]), max_new_tokens=10**12, num_beams=2)


def test_encoder_decoder_needs_a_start_token():
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        generate(seq2seq(), src_ids=torch.tensor([[1, 2]]))


# The command line -------------------------------------------------------------------------------

def test_cli_generates_from_a_saved_model_directory(tmp_path, capsys):
    """The whole path: a model saved as a checkpoint, its tokenizer beside it, streamed text out."""
    pytest.importorskip("anatomy.checkpoints")
    from anatomy import cli
    from anatomy.training.tokenizers import train_tokenizer

    tokenizer = train_tokenizer("char", texts=["the quick brown fox jumps over the lazy dog"])
    config = ModelConfig(arch="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=2,
                         d_ff=64, max_seq_len=24, pos_encoding="learned", activation="gelu_tanh")
    model = anatomy.build_model(config, seed=0).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save(tmp_path)
    prompt = "the fox"
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    # 7 prompt tokens + 40 > max_seq_len 24: the window slides, the same as the API, said once
    assert captured.err.count("the window slid") == 1
    expected = generate(model, torch.tensor([tokenizer.encode_prompt(prompt)]), max_new_tokens=40,
                        stop_tokens=tokenizer.eos_id)
    assert expected.window_slid
    new = expected.new_tokens[0][expected.padding_mask[0, expected.prompt_length:]]
    assert captured.out == prompt + tokenizer.decode(new.tolist()) + "\n"
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--strategy", "beam",
                     "--num-beams", "3", "--max-new-tokens", "5"]) == 0
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--top-p", "0.9",
                     "--seed", "1", "--max-new-tokens", "5"]) == 0
    assert "seed 1" in capsys.readouterr().err


def test_cli_never_sends_control_characters_to_the_terminal(capsys):
    from anatomy import cli

    assert cli.main(["generate", "--prompt", "Hello \x1b]0;PWNED\x07\x1b[2J World,", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert out.startswith("Hello \\x1b]0;PWNED\\x07\\x1b[2J World,")  # shown, escaped


# Fuzz: whatever the arguments, an answer or a ValueError that names the problem ----------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_MODEL = decoder(max_seq_len=8)
ODD = st.sampled_from([float("nan"), float("inf"), -1, 0, True, "2", [1], 10**12, 2.5])
VALID = {  # each argument's valid values (max_new_tokens past the context of 8: the window slides)
    "max_new_tokens": st.integers(1, 12),
    "num_beams": st.integers(1, 3),
    "temperature": st.floats(0.05, 5.0),
    "top_k": st.one_of(st.none(), st.integers(1, 20)),
    "top_p": st.one_of(st.none(), st.floats(0.01, 1.0)),
    "length_penalty": st.floats(-2.0, 2.0),
    "stop_tokens": st.one_of(st.none(), st.integers(0, 12), st.lists(st.integers(0, 12), max_size=3)),
    "pad_token_id": st.one_of(st.none(), st.integers(0, 12)),
    "use_cache": st.booleans(),
    "seed": st.one_of(st.none(), st.integers(0, 2**63)),
}
INVALID = {
    "max_new_tokens": st.one_of(st.integers(-3, 0), ODD),
    "num_beams": st.one_of(st.integers(-3, 0), ODD),
    "temperature": st.one_of(st.floats(-5.0, 0.0), ODD),
    "top_k": st.one_of(st.integers(-3, 0), ODD),
    "top_p": st.one_of(st.floats(1.01, 3.0), st.floats(-1.0, 0.0), ODD),
    "length_penalty": ODD,
    "stop_tokens": st.one_of(st.integers(13, 20), st.lists(st.integers(-3, -1), min_size=1, max_size=2), ODD),
    "pad_token_id": st.one_of(st.integers(13, 20), st.integers(-3, -1), ODD),
    "use_cache": ODD,
    "seed": st.one_of(st.integers(-3, -1), ODD),
}


@st.composite
def prompts(draw, broken: bool):
    """(input_ids, padding_mask): valid, or (broken) of a wrong dtype, shape, value or mask."""
    ids = torch.randint(0, TINY["vocab_size"], draw(st.sampled_from([(1, 3), (2, 4), (2, 12)])))
    padding_mask = draw(st.sampled_from([None, torch.ones(ids.shape, dtype=torch.bool)]))
    if padding_mask is not None and draw(st.booleans()):
        padding_mask[0, 0] = False  # left padding
    if not broken:
        return ids, padding_mask
    how = draw(st.sampled_from(["int16", "uint8", "float", "bool", "1-d", "3-d", "empty", "too-big", "negative",
                                "right-padded", "mask-shape", "mask-ints", "list"]))
    return {
        "int16": (ids.to(torch.int16), None), "uint8": (ids.to(torch.uint8), None),
        "float": (ids.float(), None), "bool": (ids.bool(), None), "1-d": (ids[0], None),
        "3-d": (ids[None], None), "empty": (ids[:, :0], None),
        "too-big": (ids + TINY["vocab_size"], None), "negative": (ids - TINY["vocab_size"], None),
        "right-padded": (ids, torch.ones(ids.shape, dtype=torch.bool).index_fill(1, torch.tensor([ids.shape[1] - 1]),
                                                                                  False)),
        "mask-shape": (ids, torch.ones(ids.shape[0], ids.shape[1] + 1, dtype=torch.bool)),
        "mask-ints": (ids, torch.ones(ids.shape, dtype=torch.long)),
        "list": (ids.tolist(), None),
    }[how]


@st.composite
def generation_calls(draw):
    """A strategy and its arguments, with none, one or two of them (or the prompt) broken."""
    broken = draw(st.sets(st.sampled_from([*VALID, "prompt", "strategy"]), max_size=2))
    strategy = draw(st.sampled_from(["nucleus", 3] if "strategy" in broken else [None, "greedy", "sample", "beam"]))
    kwargs = {name: draw(INVALID[name] if name in broken else VALID[name]) for name in VALID}
    if strategy != "sample":  # sampling options are errors elsewhere: keep them only where they are broken
        for name in ("temperature", "top_k", "top_p", "seed"):
            if name not in broken:
                kwargs.pop(name)
    if strategy not in ("beam", None) and "num_beams" not in broken:
        kwargs.pop("num_beams")
    return draw(prompts(broken="prompt" in broken)), dict(kwargs, strategy=strategy), broken


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=generation_calls())
def test_fuzzed_arguments_give_an_answer_or_a_named_value_error(call):
    (ids, padding_mask), kwargs, broken = call
    try:
        out = generate(FUZZ_MODEL, ids, padding_mask=padding_mask, **kwargs)
    except ValueError as error:
        assert str(error), "an error with no message"
        event("refused")
        return
    event("answered" + (" despite " + ", ".join(sorted(broken)) if broken else ""))
    # an answer: the prompt, then at most max_new_tokens ids from the vocabulary
    assert out.sequences.shape[0] == ids.shape[0]
    assert 1 <= out.new_tokens.shape[1] <= kwargs["max_new_tokens"]
    assert torch.equal(out.sequences[:, :ids.shape[1]], ids.to(out.sequences.dtype))
    assert int(out.new_tokens.min()) >= 0 and int(out.new_tokens.max()) < TINY["vocab_size"]
