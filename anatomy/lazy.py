"""Packages whose names are imported when first used (PEP 562, as SciPy's and scikit-image's are).

`import anatomy` and `import anatomy.walk` take milliseconds and import no torch: the command line
parses and checks its arguments, and refuses a bad one, before it pays the second that importing
torch costs. A package's __init__ lists its public names and the module each comes from:

    __all__ = lazy_names(__name__, {
        "walkthrough": ".walkthrough",      # anatomy.walk.walkthrough, imported on first use
        "render_html": ".render_html",
    })

A submodule is an attribute too, imported on first use (`anatomy.generation.sampling`). A name is
looked up in its module at every use, never copied into the package, so that replacing it in its
module (a test's monkeypatch) is seen everywhere and undone everywhere.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


class LazyPackage(ModuleType):
    """A package whose `names` come from their modules at each use. Where a name is also a
    submodule's (anatomy.trace, the function, in anatomy/trace.py), the name wins over the module, as
    `from .trace import trace` in an __init__ makes it: importing the submodule does not replace it."""

    lazy: dict[str, str]

    def __getattr__(self, name: str):
        if name.startswith("_"):  # what tools probe for (__wrapped__ ...): never a public name or module
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        if name in self.lazy:
            return getattr(importlib.import_module(self.lazy[name], self.__name__), name)
        try:
            return importlib.import_module(f".{name}", self.__name__)
        except ModuleNotFoundError as error:
            if error.name != f"{self.__name__}.{name}":
                raise  # the submodule exists, and something it imports is missing
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None

    def __setattr__(self, name: str, value) -> None:
        # The import system sets `package.trace = <module anatomy.trace>` once the submodule is loaded.
        if name in self.lazy and isinstance(value, ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            return
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.lazy))


def lazy_names(package: str, names: dict[str, str]) -> list[str]:
    """Make the package `package` (its __name__) a LazyPackage serving `names` (public name -> the
    module it is read from, relative to the package like ".walkthrough", or absolute); returns its
    __all__."""
    module = sys.modules[package]
    module.__class__ = LazyPackage
    object.__setattr__(module, "lazy", dict(names))
    return sorted(names)


__all__ = ["LazyPackage", "lazy_names"]
