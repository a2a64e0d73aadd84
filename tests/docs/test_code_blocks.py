"""Every ```python block of the site's pages (docs/**/*.md, the README, BENCHMARKS.md, recipes/README.md) runs.

A page's blocks run in order in one namespace, as a reader pastes them, in a fresh folder, on the built-in models
(toy, minilm, smollm2). A block that cannot run says so on the page, in its title, which the site shows above it:

    ```python title="Not run in the tests: a download, a folder and a file of your own, and a GPU"

What a page reads that only a recipe makes is put where the page reads it, random and of the same shape: a
trained SAE (runs/sae, recipes/sae_smollm2.sh, 44 minutes) and a transcoder set on every layer (runs/tc,
runs/transcoders-smollm2, recipes/transcoders_smollm2.sh, 49 minutes). The blocks test the calls; the recipes
make the numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md")),
         "README.md", "BENCHMARKS.md", "recipes/README.md"]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```$", re.M | re.S)
NOT_RUN = re.compile(r'^ title="Not run in the tests: [^"]{10,}"$')


def blocks(page: str) -> list[tuple[int, str, str]]:
    """(the line its code starts on, the fence's words after `python`, the code) of every python block."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start(2)) + 1, match[1], match[2]) for match in FENCE.finditer(text)]


def random_sae(folder: Path, model) -> None:
    """The recipe's shape: SmolLM2's layer 15, 4608 TopK features, k 32."""
    import anatomy

    anatomy.SAE(model.config.d_model, 4608, kind="topk", k=32, point="blocks.15.resid_post", seed=0).save(folder)


def random_transcoders(folder: Path, model) -> None:
    """A JumpReLU transcoder on every layer, 256 features, calibrated to fire 4 per token (a small graph)."""
    import torch

    from anatomy.bench.circuit_sets import calibrated_random_transcoders
    from anatomy.sae import save_transcoders

    ids = torch.tensor([model.tokenizer.encode("The capital of Germany is Berlin. The capital of France is Paris.")])
    save_transcoders(calibrated_random_transcoders(model, ids, features=256, active=4), folder)


RECIPES = {"runs/sae": random_sae, "runs/tc": random_transcoders, "runs/transcoders-smollm2": random_transcoders}
RUNNABLE = [page for page in PAGES if any(not NOT_RUN.match(info) for _, info, _ in blocks(page))]


def test_a_block_either_runs_or_says_why_not():
    """The only words a python fence may carry are the visible reason it does not run."""
    marked = {(page, line): info for page in PAGES for line, info, _ in blocks(page) if info.strip()}
    assert all(NOT_RUN.match(info) for info in marked.values()), marked
    assert RUNNABLE, "no page has a python block to run"


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE)
def test_the_pages_python_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = [(line, source) for line, info, source in blocks(page) if not NOT_RUN.match(info)]
    needed = [path for path in RECIPES if any(f'"{path}"' in source for _, source in code)]
    if needed:
        import anatomy

        model = anatomy.from_pretrained("smollm2")
        for path in needed:
            RECIPES[path](tmp_path / path, model)
    namespace = {"__name__": "__main__"}
    for line, source in code:
        # the page's own line numbers in a traceback
        exec(compile("\n" * (line - 1) + source, str(ROOT / page), "exec"), namespace)
