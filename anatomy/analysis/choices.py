"""The values the analyses' options take, named once for the library and for `anatomy analyze`.

This module imports nothing heavy, so that the command line checks `--kind` and `--by` before torch loads.
"""

KINDS = ("previous_token", "induction", "duplicate")  # detect_heads: the kinds of head scored
BY = ("position", "head", "layer")  # patch: one cell per position, per head, or per layer

__all__ = ["BY", "KINDS"]
