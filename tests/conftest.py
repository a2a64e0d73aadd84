"""Shared test setup.

The suite runs with `pytest -n 2` on two cores: each worker computes on one thread, so that the
workers do not fight over cores (tiny models are faster on one thread anyway).
"""

import shutil
import tempfile

import pytest
import torch

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


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
