"""The reference site builds strictly (no warning: no broken link, no unresolved reference), and its API pages
hold every public name of the packages they document, each with its docstring, signature and source.

A public name is one in the package's `__all__` (anatomy.lazy's tables). An API page names what it documents in
mkdocstrings' directives (`::: anatomy.circuits.attribution_graph`); a name added to a package without a line on
its page fails here.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = {"anatomy": "anatomy", "anatomy.analysis": "analysis", "anatomy.sae": "sae", "anatomy.circuits": "circuits",
       "anatomy.circuits.discovery": "discovery", "anatomy.training": "training", "anatomy.explore": "explore"}
# public names that are not an object to read a docstring from: described on their page, under this anchor
DESCRIBED = {"anatomy.explore.app"}  # the app `create_app` returns, built from the environment when first asked for
DIRECTIVE = re.compile(r"^::: (\S+)", re.M)


def documented(page: str) -> list[str]:
    return DIRECTIVE.findall((ROOT / "docs" / "api" / f"{page}.md").read_text(encoding="utf-8"))


def resolve(identifier: str):
    """The object `identifier` names, as mkdocstrings reads it: the longest importable module, then attributes
    (so `anatomy.circuits.discovery.faithfulness` is the module, and the function needs its module's path)."""
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(identifier)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)})
    assert build.returncode == 0, build.stderr[-3000:]
    assert "WARNING" not in build.stderr, build.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("package", list(API))
def test_the_api_page_documents_every_public_name(package):
    """Every name of __all__ is on its package's page, as itself (the same object; a name that is also a
    submodule's is documented through its module, anatomy.trace.trace), and nothing on the page is not public."""
    module = importlib.import_module(package)
    identifiers = documented(API[package])
    on_page = {id(resolve(identifier)) for identifier in identifiers}
    public = {name for name in module.__all__ if f"{package}.{name}" not in DESCRIBED}
    missing = sorted(name for name in public if id(getattr(module, name)) not in on_page)
    assert not missing, f"docs/api/{API[package]}.md lacks {missing}"
    objects = {id(getattr(module, name)) for name in public}
    extra = [identifier for identifier in identifiers if id(resolve(identifier)) not in objects]
    assert not extra, f"docs/api/{API[package]}.md documents names {package} does not export: {extra}"
    for name in public:
        value = getattr(module, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{package}.{name} has no docstring"


@pytest.mark.slow
@pytest.mark.parametrize("package", list(API))
def test_the_built_page_shows_each_with_its_signature_and_source(site, package):
    html = (site / "api" / API[package] / "index.html").read_text(encoding="utf-8")
    for identifier in documented(API[package]):
        start = html.find(f'id="{identifier}"')
        assert start >= 0, f"{identifier} has no entry on the built page"
        value = resolve(identifier)
        if inspect.isfunction(value) or inspect.isclass(value):
            entry = html[start:html.find('class="doc doc-heading"', html.find("</h", start))]
            if inspect.isfunction(value) or "__init__" in vars(value):  # an exception's is its base's
                assert "doc-signature" in entry, f"{identifier} is shown without its signature"
            assert "Source code in" in entry, f"{identifier} is shown without its source"
    for anchor in DESCRIBED:
        if anchor.rpartition(".")[0] == package:
            assert f'id="{anchor}"' in html, f"{anchor} is not described on its page"


@pytest.mark.slow
def test_the_readme_is_the_home_page_and_its_tour_links_reach_the_tour_pages(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    tour = sorted(path.stem for path in (ROOT / "docs" / "tour").glob("*.md"))
    assert tour and all(f'href="tour/{page}/"' in home for page in tour), tour
    assert all((site / "tour" / page / "index.html").is_file() for page in tour)
