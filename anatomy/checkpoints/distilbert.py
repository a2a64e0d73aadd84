"""DistilBERT: BERT with half the layers and no token types. Post-norm, learned positions, a
LayerNorm after the embeddings (every norm with eps 1e-12). The masked-LM head is BERT's transform
(vocab_transform, the activation, vocab_layer_norm) and a tied vocab_projector; the sequence
classifier reads the first token through pre_classifier and a ReLU, which is anatomy's pooler with
pooler_activation="relu"."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, label_fields, num_labels, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .table_helpers import plain_heads, weight_and_bias

FLAGS = dict(
    arch="encoder", pos_encoding="learned", norm="layernorm", norm_position="post", final_norm=False,
    embed_norm=True, scale_embeddings=False, type_vocab_size=0, attn_bias=True, attn_out_bias=True, mlp_bias=True,
    pooling="first", norm_eps=1e-12, pos_offset=0, positions_from_padding=False, lm_head_rescale=False,
)
CLASSES = {
    "DistilBertModel": "none",
    "DistilBertForMaskedLM": "masked-lm",
    "DistilBertForSequenceClassification": "sequence-classification",
    "DistilBertForTokenClassification": "token-classification",
}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("distilbert", hf, sinusoidal_pos_embds=False)
    head = CLASSES[class_name]
    classify = head == "sequence-classification"
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "distilbert"), d_model=field(hf, "dim", "distilbert"),
        n_heads=field(hf, "n_heads", "distilbert"), n_layers=field(hf, "n_layers", "distilbert"),
        d_ff=field(hf, "hidden_dim", "distilbert"), max_seq_len=field(hf, "max_position_embeddings", "distilbert", 512),
        activation=activation(hf, "activation", "distilbert", "gelu"), pad_token_id=pad_id(hf),
        dropout=hf.get("dropout", 0.1), attn_dropout=hf.get("attention_dropout", 0.1),
        head=head, pooler=classify, pooler_activation="relu", lm_head_transform=head == "masked-lm",
        lm_head_bias=head == "masked-lm", tie_embeddings=hf.get("tie_word_embeddings", True), num_labels=num_labels(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("distilbert", config, **FLAGS, **plain_heads(config))
    if config.head == "masked-lm":
        require("distilbert masked-lm", config, lm_head_transform=True, lm_head_bias=True)
    if config.head == "sequence-classification":
        require("distilbert sequence-classification", config, pooler=True, pooler_activation="relu")
    hf = dict(
        vocab_size=config.vocab_size, dim=config.d_model, n_heads=config.n_heads, n_layers=config.n_layers,
        hidden_dim=config.d_ff, max_position_embeddings=config.max_seq_len,
        activation=to_hf_activation(config.activation, "distilbert"), pad_token_id=config.pad_token_id,
        dropout=config.dropout, attention_dropout=config.effective_attn_dropout, sinusoidal_pos_embds=False,
        tie_word_embeddings=config.tie_embeddings,
    )
    return {**hf, **label_fields(config)}


def table(config: ModelConfig) -> list[Rule]:
    layer, block = "distilbert.transformer.layer.{i}", "blocks.{i}"
    rules = [
        Rule("distilbert.embeddings.word_embeddings.weight", "token_embedding.weight"),
        Rule("distilbert.embeddings.position_embeddings.weight", "position_embedding.weight"),
        Rule("distilbert.embeddings.LayerNorm.weight", "embed_norm.weight"),
        Rule("distilbert.embeddings.LayerNorm.bias", "embed_norm.bias"),
    ]
    for hf, ours in [
        ("attention.q_lin", "attn.q_proj"), ("attention.k_lin", "attn.k_proj"), ("attention.v_lin", "attn.v_proj"),
        ("attention.out_lin", "attn.o_proj"), ("sa_layer_norm", "attn_norm"),  # post-norm: Norm(x + Attention(x))
        ("ffn.lin1", "mlp.fc_in"), ("ffn.lin2", "mlp.fc_out"), ("output_layer_norm", "mlp_norm"),
    ]:
        rules += weight_and_bias(f"{layer}.{hf}", f"{block}.{ours}")
    if config.head == "masked-lm":
        for hf, ours in [("vocab_transform", "transform_dense"), ("vocab_layer_norm", "transform_norm")]:
            rules += weight_and_bias(hf, f"lm_head.{ours}")
        rules += [
            Rule("vocab_projector.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
            Rule("vocab_projector.bias", "lm_head.proj.bias"),
        ]
    if config.head == "sequence-classification":  # pre_classifier + ReLU on the first token: the pooler
        rules += weight_and_bias("pre_classifier", "pooler.dense")
    if config.head in ("sequence-classification", "token-classification"):
        rules += weight_and_bias("classifier", "classifier")
    return rules


ARCHITECTURE = Architecture(
    model_type="distilbert", classes=CLASSES, base_prefix="distilbert", base_classes=("DistilBertModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
)
