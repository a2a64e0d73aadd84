"""BART (BartForConditionalGeneration): Marian's layers (marian.layer_rules) with learned positions
whose table starts 2 rows in (pos_offset=2: position p reads row p + 2), a LayerNorm right after
the embeddings of each stack (layernorm_embedding), GELU, post-norm, and one embedding matrix for
encoder, decoder and the tied LM head, plus final_logits_bias. Embeddings are scaled by
sqrt(d_model) only when scale_embedding says so. The decoder may have its own sizes."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .marian import layer_rules

FLAGS = dict(
    arch="encoder-decoder", pos_encoding="learned", pos_offset=2, positions_from_padding=False, norm="layernorm",
    norm_position="post", final_norm=False, embed_norm=True, type_vocab_size=0, attn_bias=True, attn_out_bias=True,
    mlp_bias=True, lm_head_bias=True, lm_head_transform=False, share_encoder_decoder_embeddings=True, norm_eps=1e-5,
    lm_head_rescale=False,
)
CLASSES = {"BartForConditionalGeneration": "lm"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("bart", hf, add_cross_attention=False)
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "bart"), d_model=field(hf, "d_model", "bart"),
        n_heads=field(hf, "encoder_attention_heads", "bart"), n_layers=field(hf, "encoder_layers", "bart"),
        d_ff=field(hf, "encoder_ffn_dim", "bart"), decoder_n_layers=field(hf, "decoder_layers", "bart"),
        decoder_n_heads=field(hf, "decoder_attention_heads", "bart"), decoder_d_ff=field(hf, "decoder_ffn_dim", "bart"),
        max_seq_len=field(hf, "max_position_embeddings", "bart", 1024),
        activation=activation(hf, "activation_function", "bart", "gelu"),
        scale_embeddings=bool(hf.get("scale_embedding", False)), pad_token_id=pad_id(hf),
        dropout=hf.get("dropout", 0.1), attn_dropout=hf.get("attention_dropout", 0.0),
        tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("bart", config, **FLAGS, n_kv_heads=config.n_heads, d_head=config.d_model // config.n_heads,
            d_embed=config.d_model)
    decoder = config.decoder_config()
    require("bart decoder", decoder, n_kv_heads=decoder.n_heads, d_head=decoder.d_model // decoder.n_heads)
    return dict(
        vocab_size=config.vocab_size, d_model=config.d_model,
        encoder_layers=config.n_layers, decoder_layers=config.decoder_n_layers,
        encoder_attention_heads=config.n_heads, decoder_attention_heads=config.decoder_n_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.decoder_d_ff, max_position_embeddings=config.max_seq_len,
        activation_function=to_hf_activation(config.activation, "bart"), scale_embedding=config.scale_embeddings,
        dropout=config.dropout, attention_dropout=config.effective_attn_dropout, activation_dropout=0.0,
        pad_token_id=config.pad_token_id, tie_word_embeddings=config.tie_embeddings, is_encoder_decoder=True,
    )


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
