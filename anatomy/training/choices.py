"""The tokenizers a run can train, named once for the library and for `anatomy train`.

This module imports nothing heavy, so that the command line's help and checks come before torch loads.
"""

KINDS = ("char", "word", "bpe", "wordpiece")

__all__ = ["KINDS"]
