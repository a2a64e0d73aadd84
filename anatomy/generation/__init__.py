"""Generation: greedy, sampling and beam search with a KV cache (generate.py), and `anatomy generate` (cli.py)."""

from .generate import STRATEGIES, GenerationOutput, generate, sampling_distribution, top_k_filter, top_p_filter

__all__ = ["STRATEGIES", "GenerationOutput", "generate", "sampling_distribution", "top_k_filter", "top_p_filter"]
