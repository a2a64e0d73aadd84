"""Phi-3: Llama whose checkpoint fuses q, k and v into one matrix qkv_proj [(H + 2K) D, E] and the
MLP's gate and up projections into gate_up_proj [2F, E]. The table splits both (rows: q, then k,
then v; gate, then up). A partial_rotary_factor rotates only the first part of each head."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import Architecture, Rule, require
from .llama import (BLOCK, FLAGS, LAYER, PRE_NORMS, embedding_rules, layer_types, norm_rules, options_off,
                    read_decoder, write_decoder)

CLASSES = {"Phi3ForCausalLM": "lm", "Phi3Model": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("phi3", hf, hidden_act="silu")
    return read_decoder(  # partial_rotary_factor: read with the rotary settings (rope.py)
        hf, "phi3", CLASSES[class_name], attn_bias=False, attn_out_bias=False, mlp_bias=False,
        **layer_types(hf, "phi3"), norm_eps=hf.get("rms_norm_eps", 1e-5), dropout=hf.get("resid_pdrop", 0.0),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("phi3", config, **{
        **options_off(config), **FLAGS, "attn_bias": False, "attn_out_bias": False, "mlp_bias": False,
        "rotary_dim": config.rotary_dim, "sliding_window": config.sliding_window,
        "layer_types": config.layer_types[:1] * config.n_layers,  # one window for every layer, or none
        "rope_scaling": "none",  # both versions' Phi-3 read "longrope" scaling only, which anatomy does not implement
    })
    return dict(write_decoder(config, "phi3"), hidden_act="silu", sliding_window=config.sliding_window, resid_pdrop=config.dropout,
                embd_pdrop=config.dropout)


def table(config: ModelConfig) -> list[Rule]:
    return embedding_rules(config) + norm_rules(PRE_NORMS) + [
        # [(H + 2K) D, E] -> q [H D, E], k [K D, E], v [K D, E]
        Rule(f"{LAYER}.self_attn.qkv_proj.weight", tuple(f"{BLOCK}.attn.{p}_proj.weight" for p in "qkv")),
        Rule(f"{LAYER}.self_attn.o_proj.weight", f"{BLOCK}.attn.o_proj.weight"),
        # [2F, E] -> gate [F, E] (through the activation), up [F, E]
        Rule(f"{LAYER}.mlp.gate_up_proj.weight", (f"{BLOCK}.mlp.fc_gate.weight", f"{BLOCK}.mlp.fc_in.weight")),
        Rule(f"{LAYER}.mlp.down_proj.weight", f"{BLOCK}.mlp.fc_out.weight"),
    ]


ARCHITECTURE = Architecture(
    model_type="phi3", classes=CLASSES, base_prefix="model", base_classes=("Phi3Model",),
    to_config=to_config, to_hf_config=to_hf_config, table=table, ignore=(r"rotary_emb\.inv_freq$",),
)
