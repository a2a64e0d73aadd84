"""A Griffe extension: the public names a package serves on first use become aliases of the objects in their
modules, so that `::: anatomy.circuits.attribution_graph` documents the function by the name users call it by,
and an object moved to another module keeps its page. Two ways of serving them, neither of which Griffe (reading
the source without running it) can follow:

- anatomy.lazy's tables (`__all__ = lazy_names(__name__, {...})`): read from the package itself (importing an
  anatomy package imports no torch), each name pointing where its object is defined (its __module__ and
  __qualname__; a table or constant, where the table says);
- a module's `__getattr__` (anatomy.explore): each `from .module import name` inside it, read from its source.
  A name it builds instead of importing (anatomy.explore.app, the app made from the environment) has no object to
  read: its page describes it.

A name that is also a submodule's (anatomy.trace, the function, in anatomy/trace.py) stays the submodule here, so
that everything imported from it still resolves: its page names it by the module (`::: anatomy.trace.trace`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util

from griffe import Alias, Extension, Module, Object


class LazyNames(Extension):
    def on_package(self, *, pkg: Module, **kwargs) -> None:
        for module in _packages(pkg):
            for name, target in {**_lazy_table(module), **_served_by_getattr(module)}.items():
                if name in module.members and module.members[name].is_module:
                    continue
                module.set_member(name, Alias(name, target, parent=module))


def _packages(module: Module):
    yield module
    for member in module.members.values():
        if isinstance(member, Object) and member.is_subpackage:
            yield from _packages(member)


def _lazy_table(module: Module) -> dict[str, str]:
    runtime = importlib.import_module(module.path)
    table = getattr(runtime, "lazy", None)
    if not isinstance(table, dict):
        return {}
    module.exports = sorted(table)
    return {name: _defined_at(runtime, name, source) for name, source in table.items()}


def _defined_at(package, name: str, source: str) -> str:
    value = getattr(package, name)
    if getattr(value, "__module__", None) and getattr(value, "__qualname__", None):
        return f"{value.__module__}.{value.__qualname__}"
    return f"{importlib.util.resolve_name(source, package.__name__)}.{name}"


def _served_by_getattr(module: Module) -> dict[str, str]:
    function = module.members.get("__getattr__")
    if function is None or not function.is_function or module.filepath is None:
        return {}
    tree = ast.parse(module.filepath.read_text(encoding="utf-8"))
    served = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for statement in ast.walk(node):
                if isinstance(statement, ast.ImportFrom):
                    source = importlib.util.resolve_name("." * statement.level + (statement.module or ""), module.path)
                    served.update({alias.asname or alias.name: f"{source}.{alias.name}" for alias in statement.names})
    return served
