"""Marian (MarianMTModel): the paper's encoder-decoder. Post-norm, sinusoidal positions with every
sine first and then every cosine (sinusoid_layout="halves"), embeddings optionally scaled by
sqrt(d_model), one embedding matrix shared by encoder, decoder and LM head, and a bias on the
logits (final_logits_bias). The activation is the config's (the released checkpoints use swish).
The decoder may have its own depth, heads and d_ff (decoder_layers, ...)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .table_helpers import plain_heads

FLAGS = dict(
    arch="encoder-decoder", pos_encoding="sinusoidal", sinusoid_layout="halves", norm="layernorm",
    norm_position="post", final_norm=False, embed_norm=False, type_vocab_size=0, attn_bias=True,
    attn_out_bias=True, mlp_bias=True, lm_head_bias=True, lm_head_transform=False,
    share_encoder_decoder_embeddings=True, norm_eps=1e-5, positions_from_padding=False, lm_head_rescale=False,
)
CLASSES = {"MarianMTModel": "lm"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("marian", hf, share_encoder_decoder_embeddings=True, normalize_before=False,
                add_final_layer_norm=False, normalize_embedding=False)
    if hf.get("decoder_vocab_size") not in (None, hf.get("vocab_size")):
        raise CheckpointError(
            f"this marian checkpoint has vocab_size={hf.get('vocab_size')} but decoder_vocab_size="
            f"{hf['decoder_vocab_size']}; anatomy implements the shared vocabulary (share_encoder_decoder_embeddings)"
        )
    return ModelConfig(**FLAGS, **fairseq_sizes(hf, "marian"))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("marian", config, **FLAGS, **plain_heads(config))
    # Marian pads with its last id by convention, and starts decoding with the pad token.
    pad = config.pad_token_id if config.pad_token_id is not None else config.vocab_size - 1
    return dict(
        fairseq_hf_sizes(config, "marian"), decoder_vocab_size=config.vocab_size, pad_token_id=pad,
        decoder_start_token_id=pad, share_encoder_decoder_embeddings=True,
    )


def fairseq_sizes(hf: dict, model_type: str) -> dict:
    """The ModelConfig fields a fairseq-style config (Marian's, BART's) spells the same way."""
    return dict(
        vocab_size=field(hf, "vocab_size", model_type), d_model=field(hf, "d_model", model_type),
        n_heads=field(hf, "encoder_attention_heads", model_type), n_layers=field(hf, "encoder_layers", model_type),
        d_ff=field(hf, "encoder_ffn_dim", model_type), decoder_n_layers=field(hf, "decoder_layers", model_type),
        decoder_n_heads=field(hf, "decoder_attention_heads", model_type),
        decoder_d_ff=field(hf, "decoder_ffn_dim", model_type),
        max_seq_len=field(hf, "max_position_embeddings", model_type, 1024),
        activation=activation(hf, "activation_function", model_type, "gelu"),
        scale_embeddings=bool(hf.get("scale_embedding", False)), pad_token_id=pad_id(hf),
        dropout=hf.get("dropout", 0.1), attn_dropout=hf.get("attention_dropout", 0.0),
        tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def fairseq_hf_sizes(config: ModelConfig, model_type: str) -> dict:
    """fairseq_sizes written back, once the decoder is checked to be plain multi-head attention."""
    decoder = config.decoder_config()
    require(f"{model_type} decoder", decoder, n_kv_heads=decoder.n_heads, d_head=decoder.d_model // decoder.n_heads)
    return dict(
        vocab_size=config.vocab_size, d_model=config.d_model,
        encoder_layers=config.n_layers, decoder_layers=config.decoder_n_layers,
        encoder_attention_heads=config.n_heads, decoder_attention_heads=config.decoder_n_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.decoder_d_ff, max_position_embeddings=config.max_seq_len,
        activation_function=to_hf_activation(config.activation, model_type), scale_embedding=config.scale_embeddings,
        dropout=config.dropout, attention_dropout=config.effective_attn_dropout, activation_dropout=0.0,
        pad_token_id=config.pad_token_id, tie_word_embeddings=config.tie_embeddings, is_encoder_decoder=True,
    )


def layer_rules(hf: str, ours: str, cross: bool) -> list[Rule]:
    """One fairseq-style layer (Marian, BART): self_attn, (encoder_attn,) fc1, fc2 and their norms."""
    parts = [("self_attn.q_proj", "attn.q_proj"), ("self_attn.k_proj", "attn.k_proj"),
             ("self_attn.v_proj", "attn.v_proj"), ("self_attn.out_proj", "attn.o_proj"),
             ("self_attn_layer_norm", "attn_norm"), ("fc1", "mlp.fc_in"), ("fc2", "mlp.fc_out"),
             ("final_layer_norm", "mlp_norm")]
    if cross:
        parts += [("encoder_attn.q_proj", "cross_attn.q_proj"), ("encoder_attn.k_proj", "cross_attn.k_proj"),
                  ("encoder_attn.v_proj", "cross_attn.v_proj"), ("encoder_attn.out_proj", "cross_attn.o_proj"),
                  ("encoder_attn_layer_norm", "cross_attn_norm")]
    return [Rule(f"{hf}.{a}.{p}", f"{ours}.{b}.{p}") for a, b in parts for p in ("weight", "bias")]


def table(config: ModelConfig) -> list[Rule]:
    rules = [
        Rule("model.shared.weight", "encoder.token_embedding.weight"),
        Rule("model.encoder.embed_tokens.weight", "encoder.token_embedding.weight", derived=True),
        Rule("model.decoder.embed_tokens.weight", "decoder.token_embedding.weight", derived=True),
        # Older checkpoints store the sinusoid tables; they must equal the formula anatomy computes.
        Rule("model.encoder.embed_positions.weight", "encoder.position_embedding.table", derived=True),
        Rule("model.decoder.embed_positions.weight", "decoder.position_embedding.table", derived=True),
        *layer_rules("model.encoder.layers.{i}", "encoder.blocks.{i}", cross=False),
        *layer_rules("model.decoder.layers.{j}", "decoder.blocks.{j}", cross=True),
        Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
        Rule("final_logits_bias", "lm_head.proj.bias", view=(1, -1)),  # [1, V] in the checkpoint
    ]
    return rules


ARCHITECTURE = Architecture(
    model_type="marian", classes=CLASSES, base_prefix="model", to_config=to_config,
    to_hf_config=to_hf_config, table=table,
)
