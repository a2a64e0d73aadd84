"""The values generation's options take, named once for the library and for `anatomy generate`.

This module imports nothing heavy, so that the command line checks them before torch loads.
"""

STRATEGIES = ("greedy", "sample", "beam")
MAX_LENGTH_PENALTY = 10  # beam search ranks by log p / length^penalty; bounded (10**12 once hung an integer power)

__all__ = ["MAX_LENGTH_PENALTY", "STRATEGIES"]
