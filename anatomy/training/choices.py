"""The choices `anatomy train` offers, named once for the library and for the command line.

This module imports nothing heavy, so that the command line's help and checks come before torch loads.
"""

KINDS = ("char", "word", "bpe", "wordpiece")  # tokenizers a run can train
OPTIMIZERS = ("adamw", "muon")  # optimizers.py
NS_SCHEDULES = ("jordan", "polar-express")  # muon.py: Newton-Schulz coefficients
NS_NORMS = ("frobenius", "gram")  # muon.py: what scales G below 1

__all__ = ["KINDS", "NS_NORMS", "NS_SCHEDULES", "OPTIMIZERS"]
