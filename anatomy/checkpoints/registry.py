"""The Hugging Face architectures anatomy reads and writes, by model_type.

Each is one file of data (checkpoints/<model_type>.py: ARCHITECTURE = Architecture(...)); adding
one is that file and one line below.
"""

from __future__ import annotations

from . import bert, gpt2, llama, marian, mistral, roberta
from . import bart, distilbert, gpt_neo, opt, t5
from . import gemma, gemma2, gemma3_text, gpt_neox, gptj, mixtral  # the rotary decoder families
from . import olmo2, phi3, qwen2, qwen3  # the rotary decoder families
from .engine import Architecture

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    bert.ARCHITECTURE,
    gpt2.ARCHITECTURE,
    llama.ARCHITECTURE,
    marian.ARCHITECTURE,
    mistral.ARCHITECTURE,
    qwen2.ARCHITECTURE,
    qwen3.ARCHITECTURE,
    gpt_neox.ARCHITECTURE,
    gemma.ARCHITECTURE,
    gemma2.ARCHITECTURE,
    roberta.ARCHITECTURE,
    distilbert.ARCHITECTURE,
    bart.ARCHITECTURE,
    opt.ARCHITECTURE,
    gpt_neo.ARCHITECTURE,
    t5.ARCHITECTURE,
    gemma3_text.ARCHITECTURE,
    olmo2.ARCHITECTURE,
    phi3.ARCHITECTURE,
    gptj.ARCHITECTURE,
    mixtral.ARCHITECTURE,
)}


def supported_architectures() -> list[str]:
    """One line per architecture: "model_type: HF class, HF class, ..." (for `anatomy models`)."""
    return [f"{name}: {', '.join(ARCHITECTURES[name].classes)}" for name in sorted(ARCHITECTURES)]
