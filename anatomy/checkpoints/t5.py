"""T5 (T5ForConditionalGeneration; Flan-T5 and T5 v1.1 too): an encoder-decoder with no absolute
positions. Each stack has one table of relative position biases, learned per head and per bucket
of key - query distance, shared by all its layers and added to the scores (pos_encoding="relative",
bidirectional buckets in the encoder, causal ones in the decoder); cross-attention has none.
Scores are not divided by sqrt(d_head) (query_pre_attn_scalar=1), norms are RMSNorm (T5's
LayerNorm has no mean and no bias), pre-norm with a final norm per stack, no biases anywhere.
feed_forward_proj "relu" is wi, wo; "gated-gelu" (Flan-T5) is wo(gelu_tanh(wi_0 x) * wi_1 x).
A head tied to the embeddings reads h * d_model^-0.5 (scale_decoder_outputs in transformers 5, which
may also rescale an untied head, or not a tied one: transformers 4 cannot, and such a folder names
transformers_version 5.0.0).
T5EncoderModel is the encoder stack alone (arch="encoder", no head)."""

from __future__ import annotations

from ..config import ModelConfig
from ..layers import ACTIVATIONS
from .common import field, pad_id
from .engine import Architecture, Rule, require
from .files import CheckpointError

FLAGS = dict(
    pos_encoding="relative", norm="rmsnorm", norm_position="pre", final_norm=True,
    embed_norm=False, scale_embeddings=False, type_vocab_size=0, attn_bias=False, attn_out_bias=False,
    mlp_bias=False, lm_head_bias=False, lm_head_transform=False, share_encoder_decoder_embeddings=True,
    query_pre_attn_scalar=1.0,
)
CLASSES = {"T5ForConditionalGeneration": "lm", "T5EncoderModel": "none"}
ARCHS = {"lm": "encoder-decoder", "none": "encoder"}  # the head each class has -> the family it is
# feed_forward_proj -> anatomy activation ("gated-gelu" is the tanh GELU, for backward compatibility)
FEED_FORWARDS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "silu": "silu", "gated-gelu": "geglu_tanh",
                 "gated-gelu_new": "geglu_tanh", "gated-silu": "swiglu"}
# The first transformers that reads scale_decoder_outputs: before it, a head is rescaled exactly when it is tied.
RESCALE_UNTIED = "5.0.0"
TO_FEED_FORWARD = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu", "geglu_tanh": "gated-gelu",
                   "swiglu": "gated-silu"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in FEED_FORWARDS:
        raise CheckpointError(f"t5 config has feed_forward_proj={proj!r}; supported: {', '.join(FEED_FORWARDS)}")
    tied = not any(k.endswith("lm_head.weight") for k in keys)  # transformers ties unless both are stored
    pad = pad_id(hf)
    n_layers = field(hf, "num_layers", "t5")
    head = CLASSES[class_name]
    seq2seq = dict(decoder_n_layers=hf.get("num_decoder_layers") or n_layers,
                   lm_head_rescale=hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings") is not False))
    return ModelConfig(
        **FLAGS, arch=ARCHS[head], head=head, **(seq2seq if head == "lm" else {}),
        vocab_size=field(hf, "vocab_size", "t5"), d_model=field(hf, "d_model", "t5"), d_head=field(hf, "d_kv", "t5"),
        n_heads=field(hf, "num_heads", "t5"), n_layers=n_layers,
        d_ff=field(hf, "d_ff", "t5"), max_seq_len=hf.get("n_positions", 512), activation=FEED_FORWARDS[proj],
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        norm_eps=hf.get("layer_norm_epsilon", 1e-6), dropout=hf.get("dropout_rate", 0.1), attn_dropout=None,
        tie_embeddings=tied, pad_token_id=pad, decoder_start_token_id=hf.get("decoder_start_token_id", pad),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    seq2seq = CLASSES[class_name] == "lm"
    require("t5", config, **FLAGS, arch=ARCHS[CLASSES[class_name]], n_kv_heads=config.n_heads, d_embed=config.d_model)
    if seq2seq:  # one num_heads and one d_ff for both stacks
        require("t5", config, decoder_n_heads=config.n_heads, decoder_d_ff=config.d_ff)
    if config.activation not in TO_FEED_FORWARD:
        raise CheckpointError(f"a t5 checkpoint cannot express activation={config.activation!r}; "
                              f"allowed: {', '.join(TO_FEED_FORWARD)}")
    hf = dict(
        vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.d_head, d_ff=config.d_ff,
        num_layers=config.n_layers, num_heads=config.n_heads, relative_attention_num_buckets=config.relative_buckets,
        relative_attention_max_distance=config.relative_max_distance, n_positions=config.max_seq_len,
        feed_forward_proj=TO_FEED_FORWARD[config.activation], layer_norm_epsilon=config.norm_eps,
        dropout_rate=config.dropout, pad_token_id=config.pad_token_id, is_encoder_decoder=seq2seq,
    )
    if seq2seq:
        hf.update(num_decoder_layers=config.decoder_n_layers, tie_word_embeddings=config.tie_embeddings,
                  scale_decoder_outputs=config.lm_head_rescale, decoder_start_token_id=config.decoder_start_token_id)
    if seq2seq and config.lm_head_rescale != config.tie_embeddings:
        hf["transformers_version"] = RESCALE_UNTIED  # transformers 4 rescales exactly when the head is tied
    return hf


def _feed_forward(hf: str, ours: str, gated: bool) -> list[Rule]:
    # gated: wo(act(wi_0 x) * wi_1 x), wi_0 the activated branch
    parts = [("wi_0", "fc_gate"), ("wi_1", "fc_in")] if gated else [("wi", "fc_in")]
    return [Rule(f"{hf}.DenseReluDense.{a}.weight", f"{ours}.mlp.{b}.weight") for a, b in parts + [("wo", "fc_out")]]


def _attention(hf: str, ours: str) -> list[Rule]:
    return [Rule(f"{hf}.{p}.weight", f"{ours}.{p}_proj.weight") for p in "qkvo"]


def table(config: ModelConfig) -> list[Rule]:
    gated = ACTIVATIONS[config.activation][1]
    enc, dec = "encoder.block.{i}.layer", "decoder.block.{j}.layer"
    ours = "encoder." if config.arch == "encoder-decoder" else ""  # T5EncoderModel: the encoder is the model
    rules = [
        Rule("shared.weight", f"{ours}token_embedding.weight"),
        Rule("encoder.embed_tokens.weight", f"{ours}token_embedding.weight", derived=True),
        # the first layer of each stack holds the table every layer of that stack uses
        Rule("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             f"{ours}relative_position_bias.weight"),
        *_attention(f"{enc}.0.SelfAttention", f"{ours}blocks.{{i}}.attn"),
        Rule(f"{enc}.0.layer_norm.weight", f"{ours}blocks.{{i}}.attn_norm.weight"),
        *_feed_forward(f"{enc}.1", f"{ours}blocks.{{i}}", gated),
        Rule(f"{enc}.1.layer_norm.weight", f"{ours}blocks.{{i}}.mlp_norm.weight"),
        Rule("encoder.final_layer_norm.weight", f"{ours}final_norm.weight"),
    ]
    if config.arch != "encoder-decoder":
        return rules
    return rules + [
        Rule("decoder.embed_tokens.weight", "decoder.token_embedding.weight", derived=True),
        Rule("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "decoder.relative_position_bias.weight"),
        *_attention(f"{dec}.0.SelfAttention", "decoder.blocks.{j}.attn"),
        Rule(f"{dec}.0.layer_norm.weight", "decoder.blocks.{j}.attn_norm.weight"),
        *_attention(f"{dec}.1.EncDecAttention", "decoder.blocks.{j}.cross_attn"),
        Rule(f"{dec}.1.layer_norm.weight", "decoder.blocks.{j}.cross_attn_norm.weight"),
        *_feed_forward(f"{dec}.2", "decoder.blocks.{j}", gated),
        Rule(f"{dec}.2.layer_norm.weight", "decoder.blocks.{j}.mlp_norm.weight"),
        Rule("decoder.final_layer_norm.weight", "decoder.final_norm.weight"),
        Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
    ]


ARCHITECTURE = Architecture(
    model_type="t5", classes=CLASSES, base_prefix="", to_config=to_config, to_hf_config=to_hf_config, table=table,
    # T5's tensors carry no prefix. Old checkpoints store an unused bias table in cross-attention.
    ignore=(r"EncDecAttention\.relative_attention_bias\.weight$",),
)
