"""recipes/ablation_report.py: the ablation's table and figure from run folders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from anatomy.config import ModelConfig

REPORT = Path(__file__).resolve().parents[2] / "recipes" / "ablation_report.py"


def _report_module():
    spec = importlib.util.spec_from_file_location("ablation_report", REPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, finals: tuple[float, float], config: ModelConfig, cpu: float | None) -> None:
    (folder / "model").mkdir(parents=True)  # written when a run finishes
    (folder / "model_config.json").write_text(config.to_json())
    records = [{"step": 1, "loss": 3.0, "tokens_per_s": 1000.0, "elapsed_s": 1.0},
               {"step": 1, "val_loss": finals[0], "elapsed_s": 1.5},
               {"step": 2, "loss": 2.0, "tokens_per_s": 3000.0, "elapsed_s": 2.0},
               {"step": 2, "val_loss": finals[1], "elapsed_s": 10.0}]
    if cpu is not None:
        records[-1]["cpu_s"] = cpu
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_table_gives_mean_spread_and_delta_and_the_figure_is_written(tmp_path):
    small = ModelConfig(arch="decoder", vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq_len=8)
    _run(tmp_path / "baseline" / "seed1", (2.5, 2.0), small, cpu=8.0)
    _run(tmp_path / "baseline" / "seed2", (2.5, 2.2), small, cpu=None)  # an older run, no CPU time
    _run(tmp_path / "rmsnorm" / "seed1", (2.4, 1.9), small, cpu=None)
    _run(tmp_path / "unfinished" / "seed1", (2.9, 2.8), small, cpu=None)
    (tmp_path / "unfinished" / "seed1" / "model").rmdir()  # killed before the end: not reported
    assert _report_module().main(tmp_path) == 0
    table = (tmp_path / "ablation.md").read_text().splitlines()
    assert table[0].startswith("| variant | val loss | seeds | parameters | wall time | CPU time |")
    baseline, rmsnorm = table[2].split(" | "), table[3].split(" | ")
    # mean of 2.0 and 2.2, sample standard deviation 0.1414; the parameters of `small`
    parameters = f"{sum(p.numel() for p in __import__('anatomy').build_model(small).parameters()) / 1e6:.3f} M"
    assert baseline[:4] == ["| baseline", "2.1000 ± 0.1414", "2", parameters]
    assert baseline[4:7] == ["10 s", "8 s", "2,000 |"]  # CPU time from the one run that has it
    assert rmsnorm[1] == "1.9000 ± 0.0000 (-0.2000)" and rmsnorm[5] == "–"
    assert not any("unfinished" in line for line in table)
    assert (tmp_path / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_classification_runs_get_an_accuracy_column_against_a_named_baseline(tmp_path):
    small = ModelConfig(arch="encoder", vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq_len=8)
    for name, accuracy in (("learned", 0.75), ("rotary", 0.5)):
        _run(tmp_path / name / "seed1", (0.7, 0.6), small, cpu=3.0)
        metrics = tmp_path / name / "seed1" / "metrics.jsonl"
        metrics.write_text(metrics.read_text() + json.dumps({"step": 2, "val_loss": 0.6, "val_accuracy": accuracy}) + "\n")
    assert _report_module().main(tmp_path, baseline="learned") == 0
    table = (tmp_path / "ablation.md").read_text().splitlines()
    assert table[0].startswith("| variant | val loss | val accuracy | seeds |")
    assert table[2].startswith("| learned | 0.6000 ± 0.0000 | 75.0% ± 0.0% | 1 |")
    assert table[3].startswith("| rotary | 0.6000 ± 0.0000 (+0.0000) | 50.0% ± 0.0% | 1 |")


def test_no_finished_run_is_an_error_not_an_empty_table(tmp_path, capsys):
    assert _report_module().main(tmp_path) == 2
    assert "no finished runs" in capsys.readouterr().err
