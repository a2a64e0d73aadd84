"""Property: whatever a checkpoint folder holds, from_pretrained gives a model or a CheckpointError,
never another exception and never a hang (hypothesis mutates config values, shard maps and files)."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from bounds import MESSAGE_CHARACTERS, bounded
from torch import nn

import anatomy
from anatomy.checkpoints import CheckpointError
from anatomy.config import ModelConfig

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SECONDS = 30  # far above a refusal's milliseconds; reaching it means a hang
CONFIG_KEYS = ["n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "n_inner", "layer_norm_epsilon",
               "activation_function", "model_type", "architectures", "tie_word_embeddings", "bos_token_id"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**13), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def source(hf_checkpoint):
    return hf_checkpoint("gpt2")


def _load_or_refuse(directory: Path, *, may_load: bool = True) -> None:
    """from_pretrained gives a model (when `may_load`) or a CheckpointError; anything else, or more
    than SECONDS, fails the test."""

    def hang(signum, frame):
        raise TimeoutError(f"from_pretrained took more than {SECONDS} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(SECONDS)
    try:
        model = anatomy.from_pretrained(directory)
        assert may_load and isinstance(model, nn.Module), "a damaged checkpoint loaded"
    except CheckpointError:
        pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


FUZZ = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@contextmanager
def edited_copy(source: Path, file: str, changes: dict):
    """A temporary copy of the checkpoint folder `source` whose JSON `file` has `changes` set
    ("a.b": the field b of the object a)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(shutil.copytree(source, Path(tmp) / "ckpt"))
        config = json.loads((directory / file).read_text())
        for key, value in changes.items():
            where, _, name = key.rpartition(".")
            (config[where] if where else config)[name] = value
        (directory / file).write_text(json.dumps(config))
        yield directory


@FUZZ
@given(key=st.sampled_from(CONFIG_KEYS), value=VALUES)
def test_any_config_value_loads_or_is_refused(source, key, value):
    with edited_copy(source, "config.json", {key: value}) as directory:
        _load_or_refuse(directory)


@FUZZ
@given(value=VALUES, which=st.integers(0, 1000))
def test_any_shard_map_entry_loads_or_is_refused(source, value, which):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(shutil.copytree(source, Path(tmp) / "ckpt"))
        from safetensors import safe_open

        with safe_open(str(directory / "model.safetensors"), "pt") as f:
            names = list(f.keys())
        (directory / "model.safetensors").rename(directory / "shard.safetensors")
        weight_map = {name: "shard.safetensors" for name in names}
        weight_map[names[which % len(names)]] = value
        (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        _load_or_refuse(directory)


@FUZZ
@given(file=st.sampled_from(["config.json", "model.safetensors"]), fraction=st.floats(0.0, 0.999))
def test_a_truncated_file_is_refused(source, file, fraction):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(shutil.copytree(source, Path(tmp) / "ckpt"))
        data = (directory / file).read_bytes()
        kept = int(len(data.rstrip()) * fraction)  # a JSON file minus its trailing newline is still whole
        (directory / file).write_bytes(data[:kept])
        _load_or_refuse(directory, may_load=False)


# Round two (issue 22): every size field of a Llama config.json and of anatomy_config.json, nested
# rope settings, and GGUF metadata values of any type. A load gives CheckpointError, or a model whose
# forward pass runs; never another exception, a hang, or memory beyond bounds.bounded's.
HOSTILE_NUMBERS = st.one_of(
    st.integers(-2, 70), st.sampled_from([0, 2**31, 2**32, 2**63, 10**12, 10**30, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=6), st.lists(st.integers(-1, 70), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
LLAMA_KEYS = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "attention_bias", "pad_token_id", "bos_token_id", "rope_parameters.rope_theta", "rope_parameters.factor",
              "rope_parameters.rope_type", "rope_parameters.original_max_position_embeddings",
              "rope_parameters.low_freq_factor"]
NATIVE_KEYS = ["n_layers", "n_experts", "n_experts_per_token", "d_model", "d_ff", "d_head", "n_heads", "n_kv_heads",
               "vocab_size", "max_seq_len", "type_vocab_size", "layer_types", "sliding_window", "rotary_dim",
               "num_labels", "norm_eps", "d_embed", "decoder_n_layers", "relative_buckets"]


def _loads_to_a_working_model(load) -> None:
    """load() is a model whose forward pass runs on one token, or a CheckpointError, within bounds."""
    with bounded():
        try:
            model = load()
        except CheckpointError as error:
            assert len(str(error)) <= MESSAGE_CHARACTERS
            return
        with torch.no_grad():
            model(torch.tensor([[1]]))


@pytest.fixture(scope="module")
def llama_source(hf_checkpoint):
    return hf_checkpoint("llama-gqa")


@FUZZ
@given(key=st.sampled_from(LLAMA_KEYS), value=HOSTILE_NUMBERS,
       rope_type=st.sampled_from(["default", "llama3", "linear"]))
def test_any_llama_size_loads_or_is_refused(llama_source, key, value, rope_type):
    rope = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    with edited_copy(llama_source, "config.json", {"rope_parameters": rope, key: value}) as directory:
        _loads_to_a_working_model(lambda: anatomy.from_pretrained(directory))


@pytest.fixture(scope="module")
def native_source(tmp_path_factory):
    config = ModelConfig(arch="decoder", vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=32,
                         pos_encoding="rotary", norm="rmsnorm", activation="swiglu", n_experts=4, n_experts_per_token=2)
    folder = tmp_path_factory.mktemp("native")
    return anatomy.save_pretrained(anatomy.build_model(config, seed=0), folder, format="anatomy")


@FUZZ
@given(key=st.sampled_from(NATIVE_KEYS), value=HOSTILE_NUMBERS)
def test_any_anatomy_config_value_loads_or_is_refused(native_source, key, value):
    with edited_copy(native_source, "anatomy_config.json", {key: value}) as directory:
        _loads_to_a_working_model(lambda: anatomy.from_pretrained(directory))


GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
             "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
             "llama.rope.dimension_count", "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
             "llama.vocab_size", "llama.rope.scaling.type", "llama.rope.scaling.factor", "general.architecture",
             "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
             "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id",
             "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
             "tokenizer.chat_template"]


def gguf_values():
    """(value, GGUF type name) of every kind a GGUF file can hold, nested arrays excepted."""
    scalars = [
        st.tuples(st.integers(0, 2**32 - 1), st.just("UINT32")),
        st.tuples(st.integers(-(2**31), 2**31 - 1), st.just("INT32")),
        st.tuples(st.integers(0, 2**64 - 1), st.just("UINT64")), st.tuples(st.booleans(), st.just("BOOL")),
        st.tuples(st.floats(width=32, allow_nan=True, allow_infinity=True), st.just("FLOAT32")),
        st.tuples(st.text(max_size=8), st.just("STRING")),
    ]
    arrays = [st.tuples(st.lists(st.integers(0, 400), min_size=1, max_size=4), st.just("ARRAY")),
              st.tuples(st.lists(st.text(max_size=4), min_size=1, max_size=4), st.just("ARRAY")),
              st.tuples(st.lists(st.floats(width=32), min_size=1, max_size=4), st.just("ARRAY")),
              st.tuples(st.lists(st.sampled_from(["Ġ t", "h e", "x y", ""]), min_size=1, max_size=320),
                        st.just("ARRAY"))]
    return st.one_of(*scalars, *arrays)


@pytest.fixture(scope="module")
def gguf_source():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_files import byte_level_vocab

    vocab = byte_level_vocab()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)).eval()
    return model, vocab


@FUZZ
@given(key=st.sampled_from(GGUF_KEYS), value=gguf_values())
def test_any_gguf_metadata_value_loads_or_is_refused(gguf_source, key, value):
    import gguf
    from gguf_files import write_gguf

    model, vocab = gguf_source
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(Path(tmp) / "m.gguf", model, arch="llama", vocab=vocab,
                          extra={key: (value[0], getattr(gguf.GGUFValueType, value[1]))})
        _loads_to_a_working_model(lambda: anatomy.from_pretrained(path))
