"""Property: whatever a checkpoint folder holds, from_pretrained gives a model or a CheckpointError,
never another exception and never a hang (hypothesis mutates config values, shard maps and files)."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from torch import nn

import anatomy
from anatomy.checkpoints import CheckpointError

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


@FUZZ
@given(key=st.sampled_from(CONFIG_KEYS), value=VALUES)
def test_any_config_value_loads_or_is_refused(source, key, value):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(shutil.copytree(source, Path(tmp) / "ckpt"))
        config = json.loads((directory / "config.json").read_text())
        config[key] = value
        (directory / "config.json").write_text(json.dumps(config))
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
