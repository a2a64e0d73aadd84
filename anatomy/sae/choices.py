"""The kinds of sparse autoencoder, named once for the library and for `anatomy sae`.

This module imports nothing heavy, so that the command line checks `--kind` before torch loads.
"""

KINDS = ("relu", "topk", "batchtopk", "jumprelu")
WITH_K = ("topk", "batchtopk")  # the kinds that keep k features per row (per batch: batchtopk)
WITH_THRESHOLD = ("batchtopk", "jumprelu")  # the kinds that infer with a threshold per feature

__all__ = ["KINDS", "WITH_K", "WITH_THRESHOLD"]
