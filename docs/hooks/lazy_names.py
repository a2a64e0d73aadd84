"""A Griffe extension: the public names a package serves through anatomy.lazy (`__all__ = lazy_names(...)`) become
aliases of the objects in their modules, so that `::: anatomy.circuits.attribution_graph` documents the function
by the name users call it by, and an object moved to another module keeps its page.

Griffe reads the source without running it, and a lazy table is a call it cannot follow: the table is read from
the package itself, and each name points where its object is defined (its __module__ and __qualname__; a table or
constant, where the table says). A name that is also a submodule's (anatomy.trace, the function, in
anatomy/trace.py) stays the submodule here, so that everything imported from it still resolves: its page names it
by the module (`::: anatomy.trace.trace`).
"""

from __future__ import annotations

import importlib
import importlib.util

from griffe import Alias, Extension, Module, Object


class LazyNames(Extension):
    def on_package(self, *, pkg: Module, **kwargs) -> None:
        for module in _packages(pkg):
            runtime = importlib.import_module(module.path)
            table = getattr(runtime, "lazy", None)
            if not isinstance(table, dict):
                continue
            for name, source in table.items():
                if name in module.members and module.members[name].is_module:
                    continue
                module.set_member(name, Alias(name, _defined_at(runtime, name, source), parent=module))
            module.exports = sorted(table)


def _packages(module: Module):
    yield module
    for member in module.members.values():
        if isinstance(member, Object) and member.is_subpackage:
            yield from _packages(member)


def _defined_at(package, name: str, source: str) -> str:
    value = getattr(package, name)
    if getattr(value, "__module__", None) and getattr(value, "__qualname__", None):
        return f"{value.__module__}.{value.__qualname__}"
    return f"{importlib.util.resolve_name(source, package.__name__)}.{name}"
