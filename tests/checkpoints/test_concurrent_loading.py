"""Loading in threads: eight threads load eight checkpoints at once while others build and train
models, as the live explorer's server threads do. Every load equals a load alone, every model
built meanwhile equals one built alone (real, initialised parameters, never meta ones), and the
process is left as it was: torch.nn.init is torch's own, no torch function mode is left active."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import anatomy
from anatomy.config import ModelConfig
from anatomy.models import build_model

FOLDERS = ["gpt2", "gpt2-untied", "bert", "marian", "llama-gqa", "llama-bias"]  # and anatomy's format, and GGUF
LOADS_PER_THREAD = 3
# torch.nn.init as torch defines it, taken before anything in this process loads a model
INIT = {name: function for name, function in vars(nn.init).items() if callable(function) and name.endswith("_")}
SMALL = ModelConfig(arch="decoder", vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16,
                    pos_encoding="rotary", norm="rmsnorm", activation="swiglu", dropout=0.0)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_state(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys(), what
    for name, tensor in expected.items():
        assert got[name].device.type == "cpu", f"{what}: {name} is on {got[name].device}"
        assert torch.equal(got[name], tensor), f"{what}: {name} differs"


def train_step(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One SGD step on a copy of `model` (no dropout: no random numbers drawn): the parameters after it."""
    model = copy.deepcopy(model)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    model.loss(ids).backward()
    optimiser.step()
    return state(model)


@pytest.fixture(scope="module")
def folders(hf_checkpoint, tmp_path_factory):
    """Six Hugging Face folders, one in anatomy's own format, one GGUF file."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from checkpoint_cases import randomise
    from gguf_files import byte_level_vocab, write_gguf

    native = anatomy.save_pretrained(build_model(SMALL.replace(n_experts=2, n_experts_per_token=1), seed=2),
                                     tmp_path_factory.mktemp("native"), format="anatomy")
    vocab = byte_level_vocab()
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)).eval()
    randomise(llama)
    gguf_path = write_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", llama, arch="llama", vocab=vocab,
                           types={"attn_q.weight": "Q8_0"})
    return [hf_checkpoint(case) for case in FOLDERS] + [native, gguf_path]


def test_eight_threads_load_while_others_build_and_train(folders):
    alone = [state(anatomy.from_pretrained(folder, tokenizer=False)) for folder in folders]
    built_alone = state(build_model(SMALL, seed=0))
    to_train = build_model(SMALL, seed=1)
    ids = torch.randint(0, SMALL.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    trained_alone = train_step(to_train, ids)
    hooks_before = len(torch_module._global_parameter_registration_hooks)

    start = threading.Barrier(len(folders) + 2)
    failures: list[str] = []
    loaded: dict[int, list[dict]] = {i: [] for i in range(len(folders))}
    built: list[dict] = []
    trained: list[dict] = []
    done = threading.Event()

    def guarded(work):
        def run(*args):
            try:
                start.wait()
                work(*args)
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                failures.append(f"{type(error).__name__}: {error}")
        return run

    def load(i):
        for _ in range(LOADS_PER_THREAD):
            loaded[i].append(state(anatomy.from_pretrained(folders[i], tokenizer=False)))

    def build():  # the only thread that seeds torch's global generator
        while not done.is_set() or not built:
            built.append(state(build_model(SMALL, seed=0)))

    def train():
        while not done.is_set() or not trained:
            trained.append(train_step(to_train, ids))

    loaders = [threading.Thread(target=guarded(load), args=(i,)) for i in range(len(folders))]
    others = [threading.Thread(target=guarded(build)), threading.Thread(target=guarded(train))]
    for thread in loaders + others:
        thread.start()
    for thread in loaders:
        thread.join()
    done.set()
    for thread in others:
        thread.join()

    assert not failures, failures
    for i, states in loaded.items():
        assert len(states) == LOADS_PER_THREAD
        for got in states:
            assert_same_state(got, alone[i], f"a load of {folders[i]} in a thread")
    assert built and trained
    for got in built:
        assert_same_state(got, built_alone, "build_model(seed=0) during loads")
    for got in trained:
        assert got.keys() == trained_alone.keys()
        for name, tensor in trained_alone.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-7)
    # nothing left changed in the process
    assert {name: getattr(nn.init, name) for name in INIT} == INIT
    assert all(function.__module__ == "torch.nn.init" for function in INIT.values())
    assert len(torch_module._global_parameter_registration_hooks) == hooks_before
    assert not torch.overrides._get_current_function_mode_stack()
    assert nn.Linear(4, 4).weight.device.type == "cpu"
    assert nn.Linear(4, 4).weight.std() > 0
