"""A MkDocs hook: the repository's own pages in the site (README.md as the home page, BENCHMARKS.md, recipes/),
read where they stand, so that each is written once.

Every page's links are written as the repository holds the files, so that they work where the repository is
read (GitHub, an editor): docs/tour/models.md links the benchmarks as ../../BENCHMARKS.md, and the README links
docs/explore.md. Here each link is resolved in the repository and pointed at the same file's place in the site.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "BENCHMARKS.md", "recipes/README.md", "recipes/ablation.png"]
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def on_files(files, config):
    for path in PAGES:
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def in_repository(site_path: str) -> str:
    return site_path if site_path in PAGES else f"docs/{site_path}"


def in_site(repository_path: str) -> str | None:
    if repository_path in PAGES:
        return repository_path
    return repository_path.removeprefix("docs/") if repository_path.startswith("docs/") else None


def on_page_markdown(markdown: str, page, config, files) -> str:
    here = posixpath.dirname(in_repository(page.file.src_uri))

    def relink(match: re.Match) -> str:
        target, hash_, anchor = match[2].partition("#")
        if not target or "://" in target or target.startswith(("/", "mailto:")):
            return match[0]
        site_path = in_site(posixpath.normpath(posixpath.join(here, target)))
        if site_path is None:
            return match[0]  # outside the site: MkDocs names it
        relative = posixpath.relpath(site_path, posixpath.dirname(page.file.src_uri) or ".")
        return f"{match[1]}{relative}{hash_}{anchor}{match[3]}"

    return LINK.sub(relink, markdown)
