"""A panel's export: its JSON, the self-contained page `anatomy viz` or `anatomy analyze` writes for it,
or a PNG; what the page's HTML, PNG and JSON links download (GET /api/export, docs/explore.md).
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import torch

from ..analysis import attention_rollout, direct_logit_attribution, gradient_x_input, integrated_gradients
from ..analysis.views import payload_view
from ..analysis.heads import KINDS
from ..viz import views as attention_views
from ..viz.adapters import from_trace
from . import analyses
from . import lens as lens_panel
from . import panels
from .values import ExploreError, finite, int_setting


ATTENTION_VIEWS = ("head", "model", "neuron")


def export_file(slot, p, what: str, fmt: str, settings: dict) -> tuple[bytes, str, str]:
    """(body, media type, file name) of one panel's export: its JSON, the self-contained HTML page
    `anatomy viz` or `anatomy analyze` writes for it, or a PNG figure."""
    view = settings.get("view", "head")
    if view not in ATTENTION_VIEWS:  # only the attention page has views; a wrong one is refused anywhere
        raise ExploreError(f"'view' must be one of {', '.join(ATTENTION_VIEWS)}, got {str(view)[:40]!r}")
    model = slot.get()
    stem = f"anatomy-{what}"
    if fmt == "json":
        builders = {"run": panels.run, "walk": panels.walk, "attention": panels.attention, "lens": lens_panel.lens,
                    "attribution": analyses.attribution, "intervene": analyses.intervene}
        if what not in builders:
            raise ExploreError(f"'panel' must be one of {', '.join(builders)} for JSON")
        data = builders[what](slot, p, settings)
        return json.dumps(finite(data), ensure_ascii=False, indent=1).encode(), "application/json", f"{stem}.json"
    if what == "walk":
        if fmt != "html":
            raise ExploreError("the walk exports as html or json")
        panels.walk(slot, p, settings)  # the panel's walk of this pass, every step built by the page
        return p.memo["walk"].walk.to_html().encode(), "text/html", f"{stem}.html"
    if what == "attention":
        maps = [from_trace(p.trace, m["queries"], m["keys"], stack=m["stack"], attention=m["attention"], name=m["name"])
                for m in panels.attention_maps(model, p)]
        layer = int_setting(settings, "layer", 0, 0, maps[0].n_layers - 1)
        head = int_setting(settings, "head", 0, 0, maps[0].n_heads - 1)
        if fmt == "png":
            from ..viz.plots import map_heatmap  # matplotlib: imported when a PNG is asked for, not at start

            return _png(map_heatmap(maps[0], layer, head)), "image/png", f"{stem}.png"
        view = settings.get("view", "head")
        title = f"“{p.text[:80]}” · {slot.name}"
        if view == "model":
            page = attention_views.model_view(maps, layer=layer, head=head, title=f"Every layer and head · {title}")
        elif view == "neuron":
            page = attention_views.neuron_view(maps, layer=layer, head=head, title=f"Inside one head · {title}")
        else:
            page = attention_views.head_view(maps, layer=layer, title=f"Attention heads · {title}")
        return page.html.encode(), "text/html", f"{stem}-{view}.html"
    if what == "lens":  # from the panel's own rows: never the [L+1, T, V] log-probabilities at once
        view = lens_panel.lens(slot, p, {"top": settings.get("top", 3)})["view"]
        if fmt == "png":
            from ..analysis import figures  # matplotlib: imported when a PNG is asked for

            return _png(figures.draw(view, view["panels"][0], "logit lens")), "image/png", f"{stem}.png"
        panel = view["panels"][0]
        page = payload_view(view, "Logit lens", f"{len(panel['rows'])} layers × {len(p.ids)} positions")
        return page.html.encode(), "text/html", f"{stem}.html"
    inputs = torch.tensor([p.ids]) if p.source_ids is None else (torch.tensor([p.source_ids]), torch.tensor([p.ids]))
    if what == "attribution":
        position = panels.default_position(model, p)
        method = settings.get("method", "dla")
        if method not in ("dla", "gxi", "ig", "rollout"):
            raise ExploreError(f"'method' must be one of dla, gxi, ig, rollout, got {method!r}")
        if method == "rollout":
            result = attention_rollout(model, inputs)
        else:
            target = analyses.target_id(model, p, settings, position)
            result = (direct_logit_attribution(model, inputs, target) if method == "dla"
                      else integrated_gradients(model, inputs, target, position=position) if method == "ig"
                      else gradient_x_input(model, inputs, target, position=position))
    elif what == "heads":
        kind = settings.get("kind", "induction")
        if kind not in KINDS:
            raise ExploreError(f"'kind' must be one of {', '.join(KINDS)}")
        result = analyses.head_scores(slot, kind)
    else:
        raise ExploreError("'panel' must be one of walk, attention, lens, attribution, heads")
    if fmt == "png":
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{stem}.png"
            result.save(path)
            return path.read_bytes(), "image/png", f"{stem}.png"
    return result.view().html.encode(), "text/html", f"{stem}.html"


def _png(figure) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=150, format="png")
    plt.close(figure)
    return buffer.getvalue()


__all__ = ["export_file"]
