"""Generation: greedy, sampling and beam search with a KV cache, sliding past the context.

generate.py (the public function), search.py (greedy, sampling, beam search), sampling.py (the
filters), runner.py (one step: the cache and the sliding window), checks.py (every argument),
cli.py (`anatomy generate`).
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "STRATEGIES": ".generate", "GenerationOutput": ".generate", "generate": ".generate",
    **{name: ".sampling" for name in ("sampling_distribution", "top_k_filter", "top_p_filter")},
})
