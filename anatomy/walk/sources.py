"""The source texts' worked examples: their names, what each shows, and their printed numbers.

The numbers are data (walk/data/*.json), copied from the sources as printed; examples.py walks
them. This module imports nothing heavy: `anatomy walk --example NAME` checks NAME before torch loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

DATA = resources.files("anatomy.walk") / "data"


@dataclass(frozen=True)
class Example:
    file: str
    description: str


@lru_cache(maxsize=None)
def load(file: str) -> dict:
    return json.loads((DATA / f"{file}.json").read_text(encoding="utf-8"))


EXAMPLES = {
    name: Example(file, load(file)["description"] + f" ({load(file)['author']})" if name != "notes" else
                  load(file)["description"] + ' (the "3 Transformer Anatomy" notes)')
    for name, file in (("armas", "armas"), ("anasashb", "anasashb"), ("notes", "anatomy-notes"))
}


__all__ = ["EXAMPLES", "Example", "load"]
