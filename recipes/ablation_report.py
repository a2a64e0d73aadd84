"""The ablation's table and plot, from the run folders recipes/ablation.sh wrote.

    python recipes/ablation_report.py runs/ablation

reads OUT/<variant>/seed<N>/{metrics.jsonl, model_config.json} and writes
    OUT/ablation.md    variant | val loss (mean ± spread over seeds) | seeds | parameters | wall time | tokens/s
    OUT/ablation.png   validation loss against step, the mean over seeds, one curve per variant
The spread is the sample standard deviation (0 with one seed). Wall time is the training time that
metrics.jsonl records at the last step; tokens/s the mean over the logged steps.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from anatomy import ModelConfig, build_model  # noqa: E402
from anatomy.training.metrics import read_metrics  # noqa: E402


def runs(out: Path) -> dict[str, list[Path]]:
    """variant -> its finished seed folders (those with a metrics.jsonl holding a validation loss)."""
    found: dict[str, list[Path]] = {}
    for seed_dir in sorted(out.glob("*/seed*")):
        if any("val_loss" in r for r in read_metrics(seed_dir)):
            found.setdefault(seed_dir.parent.name, []).append(seed_dir)
    return found


def summarise(seed_dirs: list[Path]) -> dict:
    records = [read_metrics(d) for d in seed_dirs]
    finals = [[r["val_loss"] for r in rs if "val_loss" in r][-1] for rs in records]
    config = ModelConfig.from_json((seed_dirs[0] / "model_config.json").read_text())
    curves = [{r["step"]: r["val_loss"] for r in rs if "val_loss" in r} for rs in records]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return {
        "val_loss": statistics.mean(finals),
        "spread": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "seeds": len(finals),
        "parameters": sum(p.numel() for p in build_model(config).parameters()),
        "wall_s": statistics.mean(max(r.get("elapsed_s", 0.0) for r in rs) for rs in records),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for rs in records for r in rs if "tokens_per_s" in r),
        "curve": (steps, [statistics.mean(c[s] for c in curves) for s in steps]),
    }


def table(results: dict[str, dict]) -> str:
    base = results.get("baseline")
    lines = ["| variant | val loss | seeds | parameters | wall time | tokens/s |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        delta = f" ({r['val_loss'] - base['val_loss']:+.4f})" if base and name != "baseline" else ""
        lines.append(f"| {name} | {r['val_loss']:.4f} ± {r['spread']:.4f}{delta} | {r['seeds']} | "
                     f"{r['parameters'] / 1e6:.3f} M | {r['wall_s']:.0f} s | {r['tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for name, r in results.items():
        emphasis = dict(lw=2.2, color="black") if name == "baseline" else dict(lw=2.2) if name == "modern" else dict(lw=1)
        ax.plot(*r["curve"], label=name, **emphasis)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per character), mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(out: Path) -> int:
    found = runs(out)
    if not found:
        print(f"no finished runs under {out} (expected {out}/VARIANT/seedN/metrics.jsonl)", file=sys.stderr)
        return 2
    order = sorted(found, key=lambda name: (name != "baseline", name == "modern", name))
    results = {name: summarise(found[name]) for name in order}
    (out / "ablation.md").write_text(table(results) + "\n")
    plot(results, out / "ablation.png")
    print(table(results))
    print(f"\nwrote {out / 'ablation.md'} and {out / 'ablation.png'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python recipes/ablation_report.py OUT_DIR")
    sys.exit(main(Path(sys.argv[1])))
