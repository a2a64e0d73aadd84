"""The suite itself: it must pass in any order and any split across xdist workers.

The test folders have no __init__.py, so pytest puts each folder on sys.path and imports its files by
their bare names: two helper modules with one name (tests/sae/ddp_worker.py and
tests/training/ddp_worker.py, once) are one module to Python, and whichever a worker imports first is
the one every later test gets.
"""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_every_module_under_tests_has_a_name_of_its_own():
    folders = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "fixtures" not in path.relative_to(TESTS).parts:
            folders[path.stem].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in folders.items() if len(paths) > 1}
    assert not shared, f"modules that Python would take for one another: {shared}"
