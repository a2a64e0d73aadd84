"""The ablation's table and figure, from the run folders recipes/ablation.sh (or ablation_sst2.sh) wrote.

    python recipes/ablation_report.py runs/ablation [--baseline NAME]

reads OUT/<variant>/seed<N>/{metrics.jsonl, model_config.json} and writes
    OUT/ablation.md    variant | val loss (mean ± spread over seeds, and its difference from the
                       baseline's) | [val accuracy] | seeds | parameters | wall time | CPU time | tokens/s
    OUT/ablation.png   the validation curves (mean over seeds) and each variant's final loss against the baseline's
The spread is the sample standard deviation (0 with one seed). The accuracy column appears when the
runs evaluate one (classification). Wall time and CPU time are what metrics.jsonl records at the
last step (runs share the machine, so CPU time is the fairer measure of work; "–" where a run
predates its recording); tokens/s is the mean over the logged steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from anatomy import ModelConfig, build_model  # noqa: E402
from anatomy.training.metrics import read_metrics  # noqa: E402


def runs(out: Path) -> dict[str, list[Path]]:
    """variant -> its finished seed folders (a model/ written at the end, and a validation loss)."""
    found: dict[str, list[Path]] = {}
    for seed_dir in sorted(out.glob("*/seed*")):
        if (seed_dir / "model").is_dir() and any("val_loss" in r for r in read_metrics(seed_dir)):
            found.setdefault(seed_dir.parent.name, []).append(seed_dir)
    return found


def _mean_and_spread(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _mean_or_none(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known else None


def _last(records: list[dict], key: str):
    return [r[key] for r in records if key in r][-1] if any(key in r for r in records) else None


def summarise(seed_dirs: list[Path]) -> dict:
    records = [read_metrics(d) for d in seed_dirs]
    config = ModelConfig.from_json((seed_dirs[0] / "model_config.json").read_text())
    curves = [{r["step"]: r["val_loss"] for r in rs if "val_loss" in r} for rs in records]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    accuracies = [_last(rs, "val_accuracy") for rs in records]
    return {
        "val_loss": _mean_and_spread([_last(rs, "val_loss") for rs in records]),
        "val_accuracy": _mean_and_spread(accuracies) if None not in accuracies else None,
        "seeds": len(records),
        "parameters": sum(p.numel() for p in build_model(config).parameters()),
        "wall_s": statistics.mean(max(r.get("elapsed_s", 0.0) for r in rs) for rs in records),
        "cpu_s": _mean_or_none([_last(rs, "cpu_s") for rs in records]),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for rs in records for r in rs if "tokens_per_s" in r),
        "curve": (steps, [statistics.mean(c[s] for c in curves) for s in steps]),
    }


def table(results: dict[str, dict], baseline: str) -> str:
    base = results.get(baseline)
    accuracy = any(r["val_accuracy"] for r in results.values())
    header = ["variant", "val loss"] + ["val accuracy"] * accuracy + ["seeds", "parameters", "wall time", "CPU time",
                                                                    "tokens/s"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name, r in results.items():
        (loss, spread), cells = r["val_loss"], [name]
        delta = f" ({loss - base['val_loss'][0]:+.4f})" if base and name != baseline else ""
        cells.append(f"{loss:.4f} ± {spread:.4f}{delta}")
        if accuracy:
            cells.append("–" if r["val_accuracy"] is None else "{:.1%} ± {:.1%}".format(*r["val_accuracy"]))
        cells += [str(r["seeds"]), f"{r['parameters'] / 1e6:.3f} M", f"{r['wall_s']:.0f} s",
                  "–" if r["cpu_s"] is None else f"{r['cpu_s']:.0f} s", f"{r['tokens_per_s']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], baseline: str, path: Path) -> None:
    """Left: the validation curves (mean over seeds). Right: each variant's final loss minus the
    baseline's, with the seeds' spread as error bars (better to the left of zero)."""
    fig, (curves, finals) = plt.subplots(1, 2, figsize=(12, 5.5), dpi=110, gridspec_kw={"width_ratios": [3, 2]})
    palette = plt.get_cmap("tab20").colors  # 20 distinguishable colours, dashed after the first 20
    for i, (name, r) in enumerate(results.items()):
        emphasis = dict(lw=2.4, color="black") if name == baseline else dict(lw=2.4, color="tab:red") \
            if name == "modern" else dict(lw=1.0, color=palette[i % 20], ls="-" if i < 20 else "--")
        curves.plot(*r["curve"], label=name, **emphasis)
    lowest = min(min(r["curve"][1]) for r in results.values())
    curves.set_ylim(lowest - 0.05, lowest + 0.75)  # the end of training, where the variants differ
    curves.set_xlabel("step")
    curves.set_ylabel("validation loss, mean over seeds")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=7, ncol=2)
    base = results[baseline]["val_loss"][0] if baseline in results else 0.0
    # the baseline at the top, the modern combination at the bottom, the rest from worst to best
    middle = sorted((n for n in results if n not in (baseline, "modern")), key=lambda n: -results[n]["val_loss"][0])
    names = (["modern"] if "modern" in results else []) + middle[::-1] + ([baseline] if baseline in results else [])
    deltas = [results[n]["val_loss"][0] - base for n in names]
    colours = ["black" if n == baseline else "tab:red" if n == "modern" else
               "tab:green" if d < 0 else "tab:gray" for n, d in zip(names, deltas)]
    finals.barh(names, deltas, xerr=[results[n]["val_loss"][1] for n in names], color=colours, capsize=2)
    finals.axvline(0.0, color="black", lw=0.8)
    finals.set_xlabel(f"final validation loss minus {baseline}'s (lower is better)")
    finals.tick_params(axis="y", labelsize=8)
    finals.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(out: Path, baseline: str = "baseline") -> int:
    found = runs(out)
    if not found:
        print(f"no finished runs under {out} (expected {out}/VARIANT/seedN/metrics.jsonl)", file=sys.stderr)
        return 2
    order = sorted(found, key=lambda name: (name != baseline, name == "modern", name))
    results = {name: summarise(found[name]) for name in order}
    (out / "ablation.md").write_text(table(results, baseline) + "\n")
    plot(results, baseline, out / "ablation.png")
    print(table(results, baseline))
    print(f"\nwrote {out / 'ablation.md'} and {out / 'ablation.png'}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the ablation's table and figure from its run folders")
    parser.add_argument("out", type=Path, help="the folder ablation.sh wrote (OUT/VARIANT/seedN)")
    parser.add_argument("--baseline", default="baseline", help="the variant the others are compared with")
    arguments = parser.parse_args()
    sys.exit(main(arguments.out, arguments.baseline))
