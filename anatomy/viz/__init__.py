"""Look at attention: self-contained interactive HTML views and static images.

    view = anatomy.viz.head_view(weights, tokens)   # weights [layers, heads, T, T], as bertviz
    view.save("heads.html")                          # one file, no network; or show `view` in Jupyter

Views: head_view, model_view, neuron_view, generation_view. Data: AttentionMap, and the adapters
that build it from a traced forward pass. Images: anatomy.viz.plots (matplotlib).
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "AttentionMap": ".data",
    "View": ".html", "page": ".html", "write_atomically": ".html",
    **{name: ".views" for name in ("generation_view", "head_view", "model_view", "neuron_view")},
})
