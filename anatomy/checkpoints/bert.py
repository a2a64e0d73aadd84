"""BERT (and MiniLM, which is a small BERT): post-norm, GELU, learned positions, token types,
a LayerNorm after the embeddings, a pooler (tanh(W h_[CLS] + b)) and the masked-LM head."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, label_fields, num_labels, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .table_helpers import plain_heads, weight_and_bias

# What every BERT is, whatever its size.
FLAGS = dict(
    arch="encoder", pos_encoding="learned", norm="layernorm", norm_position="post", final_norm=False,
    embed_norm=True, scale_embeddings=False, attn_bias=True, attn_out_bias=True, mlp_bias=True, pooling="first",
    pos_offset=0, positions_from_padding=False, pooler_activation="tanh", lm_head_rescale=False,
)
CLASSES = {
    "BertModel": "none",
    "BertForMaskedLM": "masked-lm",
    "BertForSequenceClassification": "sequence-classification",
    "BertForTokenClassification": "token-classification",
}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("bert", hf, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    head = CLASSES[class_name]
    # the classifier reads the pooler; the others have it when its weights are there (BertModel, and
    # masked-LM checkpoints saved from pre-training, as bert-base-uncased: transformers leaves it unused)
    pooler = head == "sequence-classification" or any(k.endswith("pooler.dense.weight") for k in keys)
    return ModelConfig(
        **FLAGS, **bert_sizes(hf, "bert"),
        max_seq_len=field(hf, "max_position_embeddings", "bert", 512),
        activation=activation(hf, "hidden_act", "bert", "gelu"),
        norm_eps=hf.get("layer_norm_eps", 1e-12), type_vocab_size=hf.get("type_vocab_size", 2),
        head=head, pooler=pooler, lm_head_transform=head == "masked-lm", lm_head_bias=head == "masked-lm",
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("bert", config, **FLAGS, **plain_heads(config))
    if config.head == "masked-lm":
        require("bert masked-lm", config, lm_head_transform=True, lm_head_bias=True)
    return bert_hf_sizes(config, "bert")


def bert_sizes(hf: dict, model_type: str) -> dict:
    """The ModelConfig fields a BERT-style config (BERT's, RoBERTa's) spells the same way."""
    d_model = field(hf, "hidden_size", model_type)
    return dict(
        vocab_size=field(hf, "vocab_size", model_type), d_model=d_model,
        n_heads=field(hf, "num_attention_heads", model_type), n_layers=field(hf, "num_hidden_layers", model_type),
        d_ff=field(hf, "intermediate_size", model_type, 4 * d_model), pad_token_id=pad_id(hf),
        dropout=hf.get("hidden_dropout_prob", 0.1), attn_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        tie_embeddings=hf.get("tie_word_embeddings", True), num_labels=num_labels(hf),
    )


def bert_hf_sizes(config: ModelConfig, model_type: str) -> dict:
    """A BERT-style config of `config`; its position table has pos_offset rows before position 0."""
    hf = dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.n_heads,
        num_hidden_layers=config.n_layers, intermediate_size=config.d_ff,
        max_position_embeddings=config.max_seq_len + config.pos_offset,
        hidden_act=to_hf_activation(config.activation, model_type), layer_norm_eps=config.norm_eps,
        type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id,
        hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.effective_attn_dropout,
        tie_word_embeddings=config.tie_embeddings, position_embedding_type="absolute",
    )
    return {**hf, **label_fields(config)}


def layer_rules(layer: str, block: str = "blocks.{i}") -> list[Rule]:
    """One BERT layer (RoBERTa's too): post-norm attention and feed-forward, every linear with a bias."""
    rules = []
    for hf, ours in [
        ("attention.self.query", "attn.q_proj"), ("attention.self.key", "attn.k_proj"),
        ("attention.self.value", "attn.v_proj"), ("attention.output.dense", "attn.o_proj"),
        ("attention.output.LayerNorm", "attn_norm"),  # post-norm: Norm(x + Attention(x))
        ("intermediate.dense", "mlp.fc_in"), ("output.dense", "mlp.fc_out"),
        ("output.LayerNorm", "mlp_norm"),
    ]:
        rules += weight_and_bias(f"{layer}.{hf}", f"{block}.{ours}")
    return rules


def table(config: ModelConfig) -> list[Rule]:
    rules = [
        Rule("bert.embeddings.word_embeddings.weight", "token_embedding.weight"),
        Rule("bert.embeddings.position_embeddings.weight", "position_embedding.weight"),
        Rule("bert.embeddings.token_type_embeddings.weight", "token_type_embedding.weight"),
        Rule("bert.embeddings.LayerNorm.weight", "embed_norm.weight"),
        Rule("bert.embeddings.LayerNorm.bias", "embed_norm.bias"),
        *layer_rules("bert.encoder.layer.{i}"),
    ]
    if config.pooler:
        rules += weight_and_bias("bert.pooler.dense", "pooler.dense")
    if config.head == "masked-lm":
        for hf, ours in [("transform.dense", "transform_dense"), ("transform.LayerNorm", "transform_norm")]:
            rules += weight_and_bias(f"cls.predictions.{hf}", f"lm_head.{ours}")
        rules += [
            Rule("cls.predictions.decoder.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
            Rule("cls.predictions.bias", "lm_head.proj.bias"),
            Rule("cls.predictions.decoder.bias", "lm_head.proj.bias", derived=True),  # the same vector
        ]
    if config.head in ("sequence-classification", "token-classification"):
        rules += weight_and_bias("classifier", "classifier")
    return rules


ARCHITECTURE = Architecture(
    model_type="bert", classes=CLASSES, base_prefix="bert", base_classes=("BertModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    # position_ids: a buffer of 0..max_len-1; old TF-converted heads also carry seq_relationship (NSP).
    ignore=(r"embeddings\.position_ids$", r"^cls\.seq_relationship\."),
)
