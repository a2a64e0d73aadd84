"""anatomy reads SAELens's files and computes what SAELens computes; SAELens reads anatomy's files back.

The fixtures were written by SAELens 6.x itself (fixtures/make_saelens_fixtures.py, run in SAELens's
own virtual environment): a tiny SAE of each kind saved with SAELens's `save_model`, and SAELens's
`encode` and `decode` of fixed inputs. anatomy must match both within 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import anatomy
from anatomy.sae import SAE, load_sae

FIXTURES = Path(__file__).parent / "fixtures"
CASES = {  # fixture -> (kind, transcoder, the trace point it reads, the point a transcoder writes)
    "relu": ("relu", False, "blocks.1.resid_post", None),
    "topk": ("topk", False, "blocks.1.resid_post", None),
    "topk_rescaled": ("topk", False, "blocks.0.mlp.out", None),
    "jumprelu": ("jumprelu", False, "blocks.1.resid_mid", None),
    "transcoder": ("relu", True, "blocks.1.mlp_norm.normalized", "blocks.1.mlp.out"),  # ln2.hook_normalized: before the gain
    "jumprelu_transcoder": ("jumprelu", True, "blocks.0.mlp_norm.normalized", "blocks.0.mlp.out"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_encode_and_decode_equal_saelens(name):
    sae = load_sae(FIXTURES / name)
    expected = load_file(str(FIXTURES / name / "expected.safetensors"))
    kind, transcoder, point, point_out = CASES[name]
    assert (sae.kind, sae.is_transcoder, sae.point, sae.point_out) == (kind, transcoder, point, point_out)
    with torch.no_grad():
        features = sae.encode(expected["x"])
        recon = sae.decode(features)
    assert torch.equal(features > 0, expected["features"] > 0)  # the same features fire
    assert (features - expected["features"]).abs().max() < 1e-5
    assert (recon - expected["recon"]).abs().max() < 1e-5


def test_gemma_scope_point_from_the_repository_and_folder_names(tmp_path):
    """As SAELens's Gemma Scope loader decides it: -res reads resid_post, -mlp mlp.out, -att attn.z (heads
    flattened), transcoders read the MLP's input and write its output; the layer from layer_N."""
    import shutil

    expected = {"gemma-scope-2b-pt-res": ("blocks.7.resid_post", None), "gemma-scope-2b-pt-mlp": ("blocks.7.mlp.out", None),
                "gemma-scope-2b-pt-transcoders": ("blocks.7.mlp_norm.normalized", "blocks.7.mlp_out_norm.out")}
    for repository, (point, point_out) in expected.items():
        folder = tmp_path / repository / "layer_7" / "width_16k" / "average_l0_5"
        folder.mkdir(parents=True)
        shutil.copy(FIXTURES / "gemma_scope" / "layer_1" / "params.npz", folder)
        sae = load_sae(folder)
        assert (sae.point, sae.point_out, sae.is_transcoder) == (point, point_out, point_out is not None)
    assert load_sae(FIXTURES / "gemma_scope" / "layer_1" / "params.npz").point is None  # no repository name: unknown


def test_gemma_scope_params_npz_equals_saelens_gemma_scope_loader():
    folder = FIXTURES / "gemma_scope" / "layer_1"
    with safe_open(str(folder / "expected.safetensors"), "pt") as handle:
        hook = handle.metadata()["hook"]
    expected = load_file(str(folder / "expected.safetensors"))
    sae = anatomy.load_sae(folder / "params.npz", point=hook)
    assert (sae.kind, sae.apply_b_dec_to_input, sae.point) == ("jumprelu", False, "blocks.1.resid_post")
    with torch.no_grad():
        features = sae.encode(expected["x"])
        recon = sae.decode(features)
    assert (features - expected["features"]).abs().max() < 1e-5
    assert (recon - expected["recon"]).abs().max() < 1e-5


@pytest.mark.parametrize("name", list(CASES))
def test_save_writes_what_saelens_wrote(tmp_path, name):
    """anatomy's cfg.json has SAELens's keys and values (the version stamps aside), its weights the same
    tensors (the rescaled TopK's norms folded: the same function, unit decoder rows)."""
    sae = load_sae(FIXTURES / name)
    sae.save(tmp_path)
    ours, theirs = (json.loads((folder / "cfg.json").read_text()) for folder in (tmp_path, FIXTURES / name))
    for config in (ours, theirs):
        config["metadata"] = {k: v for k, v in config["metadata"].items() if "version" not in k}
        config.pop("rescale_acts_by_decoder_norm", None)
    assert ours == theirs
    again = load_sae(tmp_path)
    x = load_file(str(FIXTURES / name / "expected.safetensors"))["x"]
    with torch.no_grad():
        assert torch.equal(again(x), sae(x))


READ_BACK = """
import sys, torch
from safetensors.torch import load_file, save_file
from sae_lens import SAE
for folder in sys.argv[1:]:
    sae = SAE.load_from_disk(folder)
    x = load_file(folder + "/x.safetensors")["x"]
    with torch.no_grad():
        features = sae.encode(x)
        save_file({"features": features.contiguous(), "recon": sae.decode(features).contiguous()},
                  folder + "/theirs.safetensors")
"""
WRITTEN = [("relu", False), ("topk", False), ("jumprelu", False), ("batchtopk", False), ("relu", True),
           ("jumprelu", True)]


@pytest.fixture(scope="module")
def read_by_saelens(tmp_path_factory) -> dict[tuple[str, bool], tuple[SAE, torch.Tensor, Path]]:
    """(kind, transcoder) -> (the SAE anatomy saved, the inputs, its folder, where SAELens wrote what it computed):
    every folder read by one SAELens process (importing SAELens takes seconds)."""
    root = tmp_path_factory.mktemp("saelens")
    written = {}
    for kind, transcoder in WRITTEN:
        torch.manual_seed(0)
        k = {"topk": 6, "batchtopk": 6.0}.get(kind)
        sae = SAE(16, 40, kind=kind, k=k, d_out=24 if transcoder else None, seed=3,
                  point="blocks.2.mlp_norm.out" if transcoder else "blocks.2.resid_post",
                  point_out="blocks.2.mlp.out" if transcoder else None).eval()
        with torch.no_grad():
            for parameter in sae.parameters():
                parameter.add_(0.2 * torch.randn_like(parameter))
            if kind in ("jumprelu", "batchtopk"):
                sae.threshold.copy_(torch.rand(40) * 0.5 if kind == "jumprelu" else torch.full((40,), 0.3))
        folder = root / f"{kind}-{'transcoder' if transcoder else 'sae'}"
        sae.save(folder)
        x = torch.randn(7, 16)
        save_file({"x": x}, str(folder / "x.safetensors"))
        written[kind, transcoder] = sae, x, folder
    folders = [str(folder) for *_, folder in written.values()]
    run = subprocess.run([os.environ["ANATOMY_SAELENS_PYTHON"], "-c", READ_BACK, *folders],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    return written


@pytest.mark.slow
@pytest.mark.peer("ANATOMY_SAELENS_PYTHON")  # SAELens pins transformer-lens < 4: an environment of its own
@pytest.mark.parametrize("kind, transcoder", WRITTEN)
def test_saelens_loads_anatomy_files_back(read_by_saelens, kind, transcoder):
    """SAELens's SAE.load_from_disk reads what `sae.save` wrote, and computes the same features and
    reconstruction within 1e-5 (a BatchTopK SAE is written, as SAELens writes one, as a JumpReLU)."""
    sae, x, folder = read_by_saelens[kind, transcoder]
    theirs = load_file(str(folder / "theirs.safetensors"))
    with torch.no_grad():
        features = sae.encode(x)
        recon = sae.decode(features)
    assert (features - theirs["features"]).abs().max() < 1e-5
    assert (recon - theirs["recon"]).abs().max() < 1e-5
