"""anatomy: the Transformer, taken apart so that anyone can see what it computes.

    import anatomy
    model = anatomy.build_model(anatomy.preset("toy"))
    with anatomy.trace(model, "*attn.pattern") as t:
        out = model(ids)
"""

from .attention import ATTENTION_KERNELS, MultiHeadAttention, eager_attention, scaled_dot_product_attention, sdpa_attention
from .cache import CacheFullError, KVCache
from .config import PRESETS, ConfigError, ModelConfig, preset
from .inputs import InputError
from .models import (
    DecoderModel,
    DecoderOutput,
    EncoderDecoderModel,
    EncoderModel,
    EncoderOutput,
    Seq2SeqOutput,
    build_model,
)
from .trace import Trace, TracePoint, trace, trace_points

# The lowest floor, imported eagerly: it registers the writer behind model.save_pretrained.
from .checkpoints import CheckpointError, Tokenizer, from_pretrained, load_tokenizer, save_pretrained, sentence_embeddings  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name):
    # Generation, views and the walkthrough import lazily: `import anatomy` stays light.
    lazy = {
        "generate": ("anatomy.generation", "generate"),
        "head_view": ("anatomy.viz", "head_view"),
        "model_view": ("anatomy.viz", "model_view"),
        "neuron_view": ("anatomy.viz", "neuron_view"),
        "generation_view": ("anatomy.viz", "generation_view"),
        "AttentionMap": ("anatomy.viz", "AttentionMap"),
        "attention_from_model": ("anatomy.viz.adapters", "attention_from_model"),
        "walkthrough": ("anatomy.walk", "walkthrough"),
    }
    if name in lazy:
        import importlib

        module_name, attribute = lazy[name]
        return getattr(importlib.import_module(module_name), attribute)
    raise AttributeError(f"module 'anatomy' has no attribute {name!r}")
