"""RoBERTa: BERT's layers (bert.layer_rules) with learned positions that start after the padding
row: a real token at position p reads row pad_token_id + 1 + p, and positions count real tokens
only (pos_offset, positions_from_padding). One token type. The masked-LM head is BERT's transform
(dense, GELU, LayerNorm) and a tied decoder; the classification head is a dense + tanh on the
first token, which is anatomy's pooler, and a projection."""

from __future__ import annotations

from ..config import ModelConfig
from .bert import bert_hf_sizes, bert_sizes, layer_rules
from .common import activation, field, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .table_helpers import plain_heads, weight_and_bias

FLAGS = dict(
    arch="encoder", pos_encoding="learned", positions_from_padding=True, norm="layernorm", norm_position="post",
    final_norm=False, embed_norm=True, scale_embeddings=False, attn_bias=True, attn_out_bias=True, mlp_bias=True,
    pooling="first", pooler_activation="tanh", lm_head_rescale=False,
)
CLASSES = {
    "RobertaModel": "none",
    "RobertaForMaskedLM": "masked-lm",
    "RobertaForSequenceClassification": "sequence-classification",
    "RobertaForTokenClassification": "token-classification",
}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("roberta", hf, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    head = CLASSES[class_name]
    act = activation(hf, "hidden_act", "roberta", "gelu")
    if head == "masked-lm" and act != "gelu":
        raise CheckpointError(f"the roberta masked-LM head always uses gelu; this checkpoint's hidden_act is {act!r}")
    pad = field(hf, "pad_token_id", "roberta", 1)
    offset = pad + 1  # rows 0..pad are never a real token's
    return ModelConfig(
        **FLAGS, **bert_sizes(hf, "roberta"),
        max_seq_len=field(hf, "max_position_embeddings", "roberta", 514) - offset, pos_offset=offset,
        activation=act, norm_eps=hf.get("layer_norm_eps", 1e-5), type_vocab_size=hf.get("type_vocab_size", 1),
        head=head, pooler=head == "sequence-classification" or any(k.endswith("pooler.dense.weight") for k in keys),
        lm_head_transform=head == "masked-lm", lm_head_bias=head == "masked-lm",
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("roberta", config, **FLAGS, **plain_heads(config))
    if config.pad_token_id is None or config.pos_offset != config.pad_token_id + 1:
        raise CheckpointError(
            f"a roberta checkpoint needs pos_offset = pad_token_id + 1; this config has "
            f"pos_offset={config.pos_offset}, pad_token_id={config.pad_token_id}"
        )
    if config.head == "masked-lm":
        require("roberta masked-lm", config, lm_head_transform=True, lm_head_bias=True, activation="gelu")
    if config.head == "sequence-classification":
        require("roberta sequence-classification", config, pooler=True)
    return bert_hf_sizes(config, "roberta")


def table(config: ModelConfig) -> list[Rule]:
    rules = [
        Rule("roberta.embeddings.word_embeddings.weight", "token_embedding.weight"),
        Rule("roberta.embeddings.position_embeddings.weight", "position_embedding.weight"),
        Rule("roberta.embeddings.token_type_embeddings.weight", "token_type_embedding.weight"),
        Rule("roberta.embeddings.LayerNorm.weight", "embed_norm.weight"),
        Rule("roberta.embeddings.LayerNorm.bias", "embed_norm.bias"),
        *layer_rules("roberta.encoder.layer.{i}"),
    ]
    if config.head == "masked-lm":
        for hf, ours in [("dense", "transform_dense"), ("layer_norm", "transform_norm")]:
            rules += weight_and_bias(f"lm_head.{hf}", f"lm_head.{ours}")
        rules += [
            Rule("lm_head.decoder.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
            Rule("lm_head.bias", "lm_head.proj.bias"),
            Rule("lm_head.decoder.bias", "lm_head.proj.bias", derived=True),  # the same vector
        ]
    if config.head == "sequence-classification":  # dense + tanh on the first token, then a projection
        rules += weight_and_bias("classifier.dense", "pooler.dense")
        rules += weight_and_bias("classifier.out_proj", "classifier")
    elif config.pooler:
        rules += weight_and_bias("roberta.pooler.dense", "pooler.dense")
    if config.head == "token-classification":
        rules += weight_and_bias("classifier", "classifier")
    return rules


ARCHITECTURE = Architecture(
    model_type="roberta", classes=CLASSES, base_prefix="roberta", base_classes=("RobertaModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    ignore=(r"embeddings\.position_ids$", r"embeddings\.token_type_ids$"),
)
