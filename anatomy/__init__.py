"""anatomy: the Transformer, taken apart so that anyone can see what it computes.

    import anatomy
    model = anatomy.build_model(anatomy.preset("toy"))
    with anatomy.trace(model, "*attn.pattern") as t:
        out = model(ids)
"""

import importlib

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
from .checkpoints import (  # noqa: E402
    BUILTIN_MODELS,
    CheckpointError,
    Tokenizer,
    from_pretrained,
    load_tokenizer,
    save_pretrained,
    sentence_embeddings,
    supported_architectures,
)

__version__ = "0.1.0"


# Generation, views, analyses and the walkthrough import lazily: `import anatomy` stays light.
_LAZY = {
    "generate": ("anatomy.generation", "generate"),
    "head_view": ("anatomy.viz", "head_view"),
    "model_view": ("anatomy.viz", "model_view"),
    "neuron_view": ("anatomy.viz", "neuron_view"),
    "generation_view": ("anatomy.viz", "generation_view"),
    "AttentionMap": ("anatomy.viz", "AttentionMap"),
    "attention_from_model": ("anatomy.viz.adapters", "attention_from_model"),
    "walkthrough": ("anatomy.walk", "walkthrough"),
    "SAE": ("anatomy.sae", "SAE"),
    "load_sae": ("anatomy.sae", "load_sae"),
    "attribution_graph": ("anatomy.circuits", "attribution_graph"),
    "TranscoderSet": ("anatomy.sae", "TranscoderSet"),
    "load_transcoders": ("anatomy.sae", "load_transcoders"),
    **{name: ("anatomy.analysis", name) for name in (
        "run_with_cache", "logit_lens", "decompose", "direct_logit_attribution", "patch", "integrated_gradients",
        "gradient_x_input", "attention_rollout", "detect_heads", "process_weights")},
}


def __getattr__(name):
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        return getattr(importlib.import_module(module_name), attribute)
    raise AttributeError(f"module 'anatomy' has no attribute {name!r}")


def __dir__():
    # Tab completion offers the lazy names too (generate, head_view, logit_lens, ...).
    return sorted(set(globals()) | set(_LAZY))
