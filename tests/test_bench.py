"""The benchmark commands run and print their tables (quick mode: tiny shapes, 2 repeats).

Nothing here asserts a time: a test on a shared machine cannot. What is asserted is what the
numbers rest on: both libraries computed the same thing (same tokens, same loss, outputs close).
"""

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from anatomy.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_table():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # the groups of this file; the others (analysis, load, ...) are tested beside their analyses
        assert main(["bench", "--quick", "--only", "encoder", "generate", "train", "trace"]) == 0
    return out.getvalue()


def test_quick_suite_prints_every_row(quick_table):
    assert "| case | unit | anatomy | transformers | speed-up | notes |" in quick_table
    for case in ("encoder: latency", "encoder: throughput", "generate:", "train: step", "trace: trace points off"):
        assert re.search(rf"^\| {re.escape(case)}", quick_table, re.M), f"no row for {case!r}:\n{quick_table}"
    assert "matmul peak" in quick_table and "bandwidth" in quick_table


def test_quick_is_labelled_a_smoke_test_with_no_speed_up(quick_table):
    assert quick_table.count("smoke test (--quick)") == 2  # above the progress lines and under the table
    rows = [line.split("|") for line in quick_table.splitlines() if line.startswith("| ") and "case" not in line]
    assert rows and all(cells[5].strip() == "n/a" for cells in rows)


def test_both_sides_computed_the_same_thing(quick_table):
    assert "same tokens: yes" in quick_table
    for diff in re.findall(r"max \|diff\| ([0-9.e+-]+)", quick_table):
        assert float(diff) < 1e-4
    losses = re.search(r"first loss ([0-9.]+) vs ([0-9.]+)", quick_table)
    assert losses and abs(float(losses[1]) - float(losses[2])) < 1e-4


def test_only_runs_the_named_group():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "trace"]) == 0
    text = out.getvalue()
    assert "trace: trace points off" in text and "encoder:" not in text


def test_overhead_and_gemv_groups_run_quick():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "overhead", "gemv"]) == 0
    text = out.getvalue()
    for case in ("overhead: encoder 1x16 pass", "overhead: decoder step", "gemv: W_QKV", "gemv: LM head"):
        assert re.search(rf"^\| {re.escape(case)}", text, re.M), f"no row for {case!r}:\n{text}"
    # both libraries reach a non-zero number of ops and modules: each side really ran a pass
    for ours, theirs in re.findall(r"module calls (\d+) vs (\d+)", text):
        assert int(ours) > 0 and int(theirs) > 0


def test_bench_code_lives_in_one_place():
    """bench/ is a floor of the package: nothing outside it imports bench code."""
    package = ROOT / "anatomy"
    for path in package.rglob("*.py"):
        if "bench" in path.relative_to(package).parts:
            continue
        text = path.read_text()
        assert "bench" not in "".join(line for line in text.splitlines() if line.lstrip().startswith(("import", "from"))), path
