"""`anatomy bench --quick --only page`: the graph page opened in Chromium with every node in view, its first
paint and the graph JSON's size in the table."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on PATH")
def test_the_page_rows_say_every_node_was_in_view_and_the_json_size():
    pytest.importorskip("playwright.sync_api")
    # a process of its own: Playwright's sync API allows one running instance per thread, and the session's
    # browser fixture may hold this one's
    done = subprocess.run([sys.executable, "-m", "anatomy.cli", "bench", "--quick", "--only", "page"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout
    assert re.search(r"^\| page: first paint, pruned graph of 35 nodes .* \| ms \| [0-9.]+ .*with every node in view",
                     table, re.M), table
    size = re.search(r"^\| page: graph JSON, the same graph \(265 edges\) \| MB \| ([0-9.e-]+) ", table, re.M)
    assert size and 0 < float(size[1]) < 5, table
