"""Tiny random models of every decoder family anatomy opens, for the circuits tests (3 layers, d_model 32 or 24,
vocab 61), each made from a Hugging Face config through anatomy's own reader for that model_type, so that each
has exactly the flags its family's checkpoints get (sandwich norms, parallel blocks, experts, q/k norms, ...).

Every parameter is drawn at random with a spread that makes the patterns vary and the norms' gains differ from
1 (from 0 for a (1 + w) gain): a frozen norm scale times its gain is then tested, not assumed.
"""

from __future__ import annotations

import torch

import anatomy
from anatomy.checkpoints.registry import ARCHITECTURES
from anatomy.sae import SAE, TranscoderSet

VOCAB = 61
PROMPT = [3, 17, 5, 29, 11, 8, 40]
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=40,
             max_position_embeddings=32, bos_token_id=1, eos_token_id=2, num_key_value_heads=2)
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}

# family (model_type, or model_type-variant) -> (Hugging Face class, its config's fields)
FAMILIES = {
    "gpt2": ("GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=24, n_layer=3, n_head=4, n_positions=32)),
    "gpt_neo": ("GPTNeoForCausalLM", dict(vocab_size=VOCAB, hidden_size=24, num_layers=3, num_heads=4, window_size=4,
                                          max_position_embeddings=32, intermediate_size=40,
                                          attention_types=[[["global", "local"], 1], [["global"], 1]])),
    "gptj": ("GPTJForCausalLM", dict(vocab_size=VOCAB, n_embd=24, n_layer=3, n_head=4, rotary_dim=4, n_inner=40,
                                     n_positions=32)),
    "gpt_neox": ("GPTNeoXForCausalLM", dict(SMALL, rotary_pct=0.5, num_key_value_heads=4)),
    "opt": ("OPTForCausalLM", dict(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                                   ffn_dim=40, max_position_embeddings=32, word_embed_proj_dim=16, pad_token_id=1)),
    "opt-post": ("OPTForCausalLM", dict(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                                        ffn_dim=40, max_position_embeddings=32, do_layer_norm_before=False,
                                        pad_token_id=1)),
    "llama": ("LlamaForCausalLM", dict(SMALL)),
    "mistral": ("MistralForCausalLM", dict(SMALL, sliding_window=4)),
    "mixtral": ("MixtralForCausalLM", dict(SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)),
    "qwen2": ("Qwen2ForCausalLM", dict(SMALL)),
    "qwen3": ("Qwen3ForCausalLM", dict(SMALL, head_dim=8)),
    "gemma": ("GemmaForCausalLM", dict(SMALL, head_dim=8)),
    "gemma2": ("Gemma2ForCausalLM", dict(SMALL, head_dim=8, query_pre_attn_scalar=12, attn_logit_softcapping=2.0,
                                         final_logit_softcapping=3.0, sliding_window=4)),
    "gemma3_text": ("Gemma3ForCausalLM", dict(SMALL, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                              rope_parameters=GEMMA3_ROPE)),
    "olmo2": ("Olmo2ForCausalLM", dict(SMALL)),
    "phi3": ("Phi3ForCausalLM", dict(SMALL, sliding_window=5, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
}


def family_config(family: str) -> anatomy.ModelConfig:
    """The ModelConfig anatomy makes of FAMILIES[family]'s Hugging Face config."""
    class_name, fields = FAMILIES[family]
    model_type = family.split("-")[0]
    return ARCHITECTURES[model_type].to_config(dict(fields, model_type=model_type), class_name, set())


def family_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of `family`, in evaluation mode (module docstring)."""
    config = family_config(family)
    model = anatomy.build_model(config, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("norm.weight"):
                parameter.copy_(0.3 * noise + (0.0 if config.norm_plus_one else 1.0))
            else:
                parameter.copy_(noise * (0.3 if parameter.dim() > 1 else 0.2))
    return model


def family_transcoders(model: torch.nn.Module, reads: str, writes: str, *, features: int = 20, kind: str = "jumprelu",
                       skip: bool = False, cross_layer: bool = False, seed: int = 0,
                       generator: torch.Generator | None = None) -> TranscoderSet:
    """A random transcoder set on every layer of `model`, reading blocks.L.<reads>, writing blocks.L.<writes>
    (drawn from `generator` if given, else from one seeded with seed + 2)."""
    d_model, n_layers = model.config.d_model, model.config.n_layers
    generator = generator or torch.Generator().manual_seed(seed + 2)
    layers = []
    for layer in range(n_layers):
        d_out = (n_layers - layer) * d_model if cross_layer else d_model
        sae = SAE(d_model, features, kind=kind, d_out=d_out, transcoder=True, skip=skip, seed=None)
        with torch.no_grad():
            for parameter in sae.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            if kind == "jumprelu":
                sae.threshold.copy_(torch.rand(features, generator=generator) * 0.3)
            if cross_layer:  # a CLT's bias and skip write its own layer only
                sae.b_dec[d_model:] = 0
                if skip:
                    sae.W_skip[d_model:] = 0
        layers.append(sae)
    return TranscoderSet(layers, cross_layer=cross_layer, input_point=f"blocks.L.{reads}",
                         output_point=f"blocks.L.{writes}").eval()
