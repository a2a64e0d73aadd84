"""Shared test setup.

The suite runs with `pytest -n 2` on two cores: each worker computes on one thread, so that the
workers do not fight over cores (tiny models are faster on one thread anyway).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test marked peer("ANATOMY_..._PYTHON") needs that peer's environment (`python -m anatomy.bench.peers`
    builds them): skipped where the variable is unset, a failure where CI_REQUIRE_PEERS=1 (.ci/run), so that no
    parity test is silently skipped in CI, and always a failure where it names no file."""
    for mark in item.iter_markers("peer"):
        variable = mark.args[0]
        python = os.environ.get(variable)
        if python and not Path(python).is_file():
            pytest.fail(f"${variable}={python} is not a file", pytrace=False)
        if not python:
            why = f"${variable} names no peer environment (python -m anatomy.bench.peers builds it)"
            if os.environ.get("CI_REQUIRE_PEERS") == "1":
                pytest.fail(f"{why}, and CI_REQUIRE_PEERS=1: a parity test may not be skipped", pytrace=False)
            pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def cache_folder(tmp_path_factory):
    """anatomy's cache (tokenized texts, ...) in a folder of the test session's, sharing only the GGUF
    cache with the user's: a dequantized SmolLM2 is the same for everyone, and warm it saves each
    worker 5 s."""
    from anatomy.checkpoints.files import cache_root

    real = cache_root()
    root = tmp_path_factory.mktemp("anatomy-cache")
    try:
        (real / "gguf").mkdir(parents=True, exist_ok=True)
        (root / "gguf").symlink_to(real / "gguf", target_is_directory=True)
    except OSError:
        pass  # a read-only home: the session's own folder caches everything
    before = os.environ.get("ANATOMY_CACHE")
    os.environ["ANATOMY_CACHE"] = str(root)
    yield root
    if before is None:
        os.environ.pop("ANATOMY_CACHE", None)
    else:
        os.environ["ANATOMY_CACHE"] = before


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of the test's own, with HF_HUB_OFFLINE set: nothing is downloaded."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def browser():
    """One headless Debian Chromium per test process, driven by Playwright, with a fresh profile;
    skips when either is missing. Every browser test shares it: Playwright's sync API allows one
    running instance per thread."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=BROWSER_ARGS,
            viewport={"width": 1280, "height": 860},
        )
        yield context
        context.close()


@pytest.fixture(scope="session")
def prenorm(tmp_path_factory) -> str:
    """A folder holding the toy refitted as a pre-norm decoder (GPT-2's block): direct logit
    attribution and circuit discovery need a residual stream that is a sum of components."""
    from anatomy.checkpoints.toys import build_toy, toy_tokenizer

    folder = tmp_path_factory.mktemp("prenorm-toy")
    build_toy("toy", norm_position="pre", final_norm=True).save_pretrained(folder)
    toy_tokenizer("toy").save(folder)
    return str(folder)
