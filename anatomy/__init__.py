"""anatomy: the Transformer, taken apart so that anyone can see what it computes.

    import anatomy
    model = anatomy.build_model(anatomy.preset("toy"))
    with anatomy.trace(model, "*attn.pattern") as t:
        out = model(ids)

Every name below is imported when first used (anatomy.lazy): `import anatomy` imports no torch, so
the command line refuses a bad argument in milliseconds.
"""

import os

from .lazy import lazy_names

# oneDNN, behind PyTorch's bfloat16 products on a CPU, keeps the kernels of the last 1,024 shapes it multiplied, each
# with scratch memory: an attribution graph's rows crossing attention in bfloat16 (circuits/frozen.py) make new shapes
# with every bucket of rows, and grew a 256-token graph by 3.5 GB. 16 are kept, unless the environment says
# otherwise; oneDNN reads this when torch is imported, so here, before.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

__version__ = "0.1.0"

__all__ = lazy_names(__name__, {
    **{name: ".attention" for name in (
        "ATTENTION_KERNELS", "MultiHeadAttention", "eager_attention", "scaled_dot_product_attention", "sdpa_attention")},
    "CacheFullError": ".cache", "KVCache": ".cache",
    "PRESETS": ".config", "ConfigError": ".config", "ModelConfig": ".config", "preset": ".config",
    "InputError": ".text", "check_text": ".text",
    **{name: ".models" for name in (
        "DecoderModel", "DecoderOutput", "EncoderDecoderModel", "EncoderModel", "EncoderOutput", "Seq2SeqOutput",
        "build_model")},
    "Trace": ".trace", "TracePoint": ".trace", "trace": ".trace", "trace_points": ".trace",
    # the checkpoints floor: it registers the writer behind model.save_pretrained when imported
    **{name: ".checkpoints" for name in (
        "BUILTIN_MODELS", "CheckpointError", "Tokenizer", "from_pretrained", "load_tokenizer", "save_pretrained",
        "sentence_embeddings", "supported_architectures")},
    "generate": ".generation",
    **{name: ".viz" for name in ("head_view", "model_view", "neuron_view", "generation_view", "AttentionMap")},
    "attention_from_model": ".viz.adapters",
    "walkthrough": ".walk",
    "SAE": ".sae", "load_sae": ".sae", "TranscoderSet": ".sae", "load_transcoders": ".sae",
    "attribution_graph": ".circuits",
    **{name: ".analysis" for name in (
        "run_with_cache", "logit_lens", "decompose", "direct_logit_attribution", "patch", "integrated_gradients",
        "gradient_x_input", "attention_rollout", "detect_heads", "process_weights")},
})
