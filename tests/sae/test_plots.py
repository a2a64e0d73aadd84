"""The frontier figure: every point's label inside the axes, none crossing the line it labels."""

from __future__ import annotations

import numpy as np
import pytest

from anatomy.sae.plots import frontier_figure, plot_frontier

pytest.importorskip("matplotlib")

# the recipe's five runs (held-out L0 and FVE), labelled as recipes/sae_smollm2.sh labels them
RUNS = [{"l0": 2.0 ** e, "fve": fve, "label": f"k={2 ** e}, CE rec. 0.999"}
        for e, fve in zip(range(3, 8), (0.825, 0.861, 0.885, 0.908, 0.932))]


def _segments_cross(box, xy: np.ndarray) -> bool:
    """Whether the polyline xy [N, 2] (display pixels) passes through the box (sampled along each segment)."""
    for a, b in zip(xy[:-1], xy[1:]):
        for t in np.linspace(0.0, 1.0, 200):
            x, y = a + t * (b - a)
            if box.x0 < x < box.x1 and box.y0 < y < box.y1:
                return True
    return False


def test_every_label_is_inside_the_axes_and_off_the_line():
    fig = frontier_figure(RUNS, "SmolLM2-135M blocks.15.resid_post, 4608 features, held-out text")
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    axis = fig.axes[0]
    inside = axis.get_window_extent(renderer)
    line = axis.get_lines()[0]
    xy = axis.transData.transform(np.column_stack(line.get_data()))  # (N, 2) pixels
    labels = axis.texts
    assert [t.get_text() for t in labels] == [r["label"] for r in RUNS]
    for text in labels:
        box = text.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, text
        assert not _segments_cross(box, xy), text.get_text()


def test_the_figure_is_written_as_a_png(tmp_path):
    path = plot_frontier(RUNS, tmp_path / "frontier.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))  # written whole, then renamed


def test_every_held_out_point_of_the_training_figure_is_inside_its_axes():
    """The dev set's records: held-out FVE below every train batch's (0.53 against 0.60 and up) is still drawn."""
    from anatomy.sae.plots import training_figure

    history = [{"step": s, "fve": f, "l0": 26.0, "dead": 0.0} for s, f in zip(range(5, 45, 5),
                                                                             (0.67, 0.60, 0.60, 0.63, 0.66, 0.65, 0.67, 0.66))]
    history += [{"step": 20, "val_fve": 0.53, "val_l0": 20.2}, {"step": 40, "val_fve": 0.58, "val_l0": 28.2}]
    fig = training_figure(history, "a transcoder on each of 30 layers, means over the layers")
    low, high = fig.axes[0].get_ylim()
    assert low <= 0.53 and high >= 0.67
    assert fig._suptitle.get_text().startswith("a transcoder on each")
