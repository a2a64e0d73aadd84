"""BART (BartForConditionalGeneration): Marian's layers (marian.layer_rules) with learned positions
whose table starts 2 rows in (pos_offset=2: position p reads row p + 2), a LayerNorm right after
the embeddings of each stack (layernorm_embedding), GELU, post-norm, and one embedding matrix for
encoder, decoder and the tied LM head, plus final_logits_bias. Embeddings are scaled by
sqrt(d_model) only when scale_embedding says so. The decoder may have its own sizes."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import Architecture, Rule, require
from .marian import fairseq_hf_sizes, fairseq_sizes, layer_rules
from .table_helpers import plain_heads

FLAGS = dict(
    arch="encoder-decoder", pos_encoding="learned", pos_offset=2, positions_from_padding=False, norm="layernorm",
    norm_position="post", final_norm=False, embed_norm=True, type_vocab_size=0, attn_bias=True, attn_out_bias=True,
    mlp_bias=True, lm_head_bias=True, lm_head_transform=False, share_encoder_decoder_embeddings=True, norm_eps=1e-5,
    lm_head_rescale=False,
)
CLASSES = {"BartForConditionalGeneration": "lm"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("bart", hf, add_cross_attention=False)
    return ModelConfig(**FLAGS, **fairseq_sizes(hf, "bart"))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("bart", config, **FLAGS, **plain_heads(config))
    return fairseq_hf_sizes(config, "bart")


def table(config: ModelConfig) -> list[Rule]:
    rules = [
        Rule("model.shared.weight", "encoder.token_embedding.weight"),
        Rule("model.encoder.embed_tokens.weight", "encoder.token_embedding.weight", derived=True),
        Rule("model.decoder.embed_tokens.weight", "decoder.token_embedding.weight", derived=True),
    ]
    for stack in ("encoder", "decoder"):
        rules += [
            Rule(f"model.{stack}.embed_positions.weight", f"{stack}.position_embedding.weight"),
            Rule(f"model.{stack}.layernorm_embedding.weight", f"{stack}.embed_norm.weight"),
            Rule(f"model.{stack}.layernorm_embedding.bias", f"{stack}.embed_norm.bias"),
        ]
    return rules + [
        *layer_rules("model.encoder.layers.{i}", "encoder.blocks.{i}", cross=False),
        *layer_rules("model.decoder.layers.{j}", "decoder.blocks.{j}", cross=True),
        Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
        Rule("final_logits_bias", "lm_head.proj.bias", view=(1, -1)),  # [1, V] in the checkpoint
    ]


ARCHITECTURE = Architecture(
    model_type="bart", classes=CLASSES, base_prefix="model", to_config=to_config,
    to_hf_config=to_hf_config, table=table,
)
