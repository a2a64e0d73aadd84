"""ModelConfig: one frozen, validated description of a Transformer.

Every architectural difference between the paper's model, BERT, GPT-2, Marian and Llama is a
field here (a flag or a value), never a model name tested inside a layer. A config is checked
once, when it is made, so that a layer never has to ask whether its options make sense.

Dimension names used across the package:
    d_model     width of the residual stream
    n_heads     query heads;  n_kv_heads  key/value heads (grouped-query attention when fewer)
    d_head      width of one head (d_model / n_heads by default)
    d_ff        hidden width of the feed-forward network
    n_layers    blocks per stack (the encoder's, for an encoder-decoder: decoder_n_layers is the decoder's)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Fields that default to None and are derived from the others when the config is made.
DERIVED_FIELDS = ("head", "final_norm", "n_kv_heads", "d_head", "decoder_n_layers", "decoder_n_heads", "decoder_d_ff",
                  "rotary_dim", "layer_types", "d_embed")
# An encoder-decoder's decoder sizes, and the encoder field each defaults to.
DECODER_SIZES = {"decoder_n_layers": "n_layers", "decoder_n_heads": "n_heads", "decoder_d_ff": "d_ff"}
SPECIAL_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
# The allowed values of every option: the error for a bad value lists them.
ARCHS = ("encoder", "decoder", "encoder-decoder")
POS_ENCODINGS = ("sinusoidal", "learned", "rotary", "alibi", "relative", "none")
SINUSOID_LAYOUTS = ("interleaved", "halves")
NORMS = ("layernorm", "rmsnorm")
# "pre": x + f(Norm(x)); "post": Norm(x + f(x)); "sandwich": x + Norm(f(Norm(x))) (Gemma 2/3);
# "post_sublayer": x + Norm(f(x)) (OLMo 2)
NORM_POSITIONS = ("pre", "post", "sandwich", "post_sublayer")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
ATTN_IMPLS = ("sdpa", "eager")
HEADS = ("none", "lm", "masked-lm", "sequence-classification", "token-classification")
POOLINGS = ("first", "mean")
POOLER_ACTIVATIONS = ("tanh", "relu")
ROTARY_LAYOUTS = ("halves", "interleaved")  # pairs (j, j + r/2) (Llama, GPT-NeoX) or (2j, 2j + 1) (GPT-J)
ROPE_SCALINGS = ("none", "linear", "llama3")
QK_NORMS = ("none", "per_head", "across_heads")  # RMSNorm over each head's d_head, or over all heads at once
LAYER_TYPES = ("full", "sliding")  # attention over every earlier key, or over the last sliding_window keys
# Which output heads each family can carry.
HEADS_BY_ARCH = {
    "encoder": ("none", "masked-lm", "sequence-classification", "token-classification"),
    "decoder": ("none", "lm"),
    "encoder-decoder": ("lm",),
}


class ConfigError(ValueError):
    """A ModelConfig field has a value that is not allowed."""


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _positive_float(name: str, value: Any) -> None:
    """A finite number > 0: NaN, infinities, booleans and strings are refused (a NaN eps gives NaN logits)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The complete, immutable description of a model. Make variants with `config.replace(...)`.

    Raises ConfigError, naming the field and the allowed values, for anything inconsistent.
    """

    arch: str = "decoder"
    vocab_size: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    max_seq_len: int = 128
    pos_encoding: str = "sinusoidal"
    norm: str = "layernorm"
    norm_position: str = "pre"
    activation: str = "gelu"
    attn_impl: str = "sdpa"
    dropout: float = 0.0

    # attention
    n_kv_heads: int | None = None  # None: one key/value head per query head
    d_head: int | None = None  # None: d_model // n_heads
    d_embed: int | None = None  # token embeddings' (and LM head's) width; None: d_model; else projected in/out (OPT)
    attn_bias: bool = True  # biases on q/k/v projections
    attn_out_bias: bool = True  # bias on the output projection
    attn_dropout: float | None = None  # None: same as dropout
    # encoder-decoder: the decoder stack's sizes (Marian, T5 may differ from the encoder); None: the encoder's
    decoder_n_layers: int | None = None
    decoder_n_heads: int | None = None
    decoder_d_ff: int | None = None
    rope_theta: float = 10000.0
    rotary_dim: int | None = None  # leading dimensions of each head that rotate; None: all of d_head
    rotary_layout: str = "halves"
    rope_scaling: str = "none"  # "linear": every frequency / factor; "llama3": low frequencies / factor, smoothed
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # llama3: wavelengths above original_max_len / this are divided by factor
    rope_high_freq_factor: float = 4.0  # llama3: wavelengths below original_max_len / this are kept
    rope_original_max_len: int = 8192  # llama3: the context length before scaling
    rope_local_theta: float | None = None  # rope base of the sliding layers (Gemma 3); None: rope_theta
    query_pre_attn_scalar: float | None = None  # scores scaled by 1/sqrt(this), not 1/sqrt(d_head) (Gemma 2/3)
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the mask (Gemma 2)
    qk_norm: str = "none"  # an RMSNorm on queries and keys before the rotation (Qwen3, OLMo 2, Gemma 3)
    sliding_window: int | None = None  # a "sliding" layer's query sees itself and the sliding_window - 1 keys before
    layer_types: tuple[str, ...] | None = None  # per layer; None: all "sliding" with a sliding_window, else "full"
    # residual stream
    parallel_residual: bool = False  # x + Attn(Norm(x)) + MLP(Norm'(x)): both sublayers read x (GPT-NeoX, GPT-J)
    parallel_shared_norm: bool = False  # the parallel branches share one norm (GPT-J)
    # feed-forward
    mlp_bias: bool = True
    n_experts: int = 0  # > 0: a mixture of experts, each a feed-forward network, chosen per token (Mixtral)
    n_experts_per_token: int = 2  # the router's top-k
    # normalisation
    norm_eps: float = 1e-5
    norm_plus_one: bool = False  # RMSNorm scales by (1 + w), so that w = 0 is the identity gain (Gemma)
    embed_norm: bool = False  # a norm right after the embeddings (BERT)
    final_norm: bool | None = None  # a norm after the last block; None: yes for pre-norm
    # embeddings
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (the paper, Marian)
    sinusoid_layout: str = "interleaved"  # "interleaved": sin,cos,sin,cos (paper); "halves": all sin then all cos
    type_vocab_size: int = 0  # segment (token type) embeddings, 0 = none
    pos_offset: int = 0  # learned positions: position p reads row p + pos_offset (OPT, BART: 2; RoBERTa: pad + 1)
    relative_buckets: int = 32  # relative positions (T5): buckets of key - query distance, per stack
    relative_max_distance: int = 128  # relative positions: distances beyond this share the last bucket
    positions_from_padding: bool = False  # position ids count real tokens only: left padding shifts none (RoBERTa, OPT)
    pad_token_id: int | None = None
    bos_token_id: int | None = None  # special ids the model was trained with (metadata for generation)
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None  # the first decoder input of an encoder-decoder
    tie_embeddings: bool = True  # output head shares the input embedding matrix
    share_encoder_decoder_embeddings: bool = True  # encoder-decoder: one token embedding for both
    # output heads
    head: str | None = None  # None: "masked-lm" for encoders, "lm" otherwise
    lm_head_bias: bool = False
    lm_head_rescale: bool = False  # the LM head reads h * d_model^-0.5 (T5 with its head tied to the embeddings)
    final_logit_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2)
    lm_head_transform: bool = False  # dense + activation + norm before the LM head (BERT MLM)
    pooler: bool = False  # dense + tanh on the pooled vector (BERT)
    pooler_activation: str = "tanh"  # the pooler's non-linearity: "relu" for DistilBERT's pre_classifier
    pooling: str = "first"
    num_labels: int = 2

    extra: dict = field(default_factory=dict, compare=False, hash=False)  # free-form metadata (e.g. source)
    # fields left as None and filled from the others; `replace` derives them again
    _derived: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        derived = tuple(name for name in DERIVED_FIELDS if getattr(self, name) is None)
        object.__setattr__(self, "_derived", derived)
        _choice("arch", self.arch, ARCHS)
        _choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _choice("sinusoid_layout", self.sinusoid_layout, SINUSOID_LAYOUTS)
        _choice("norm", self.norm, NORMS)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("attn_impl", self.attn_impl, ATTN_IMPLS)
        _choice("pooling", self.pooling, POOLINGS)
        _choice("pooler_activation", self.pooler_activation, POOLER_ACTIVATIONS)
        _choice("rotary_layout", self.rotary_layout, ROTARY_LAYOUTS)
        _choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        _choice("qk_norm", self.qk_norm, QK_NORMS)
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_seq_len", "num_labels"):
            _positive_int(name, getattr(self, name))
        if self.head is None:
            object.__setattr__(self, "head", "masked-lm" if self.arch == "encoder" else "lm")
        _choice(f"head (for arch={self.arch!r})", self.head, HEADS_BY_ARCH[self.arch])
        if self.final_norm is None:
            object.__setattr__(self, "final_norm", self.norm_position != "post")
        for name, encoder_name in DECODER_SIZES.items():
            if self.arch != "encoder-decoder":
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"{name}={getattr(self, name)!r} needs arch='encoder-decoder' (got {self.arch!r})"
                    )
                continue
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self, encoder_name))
            _positive_int(name, getattr(self, name))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        _positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads} "
                "(each key/value head serves an equal group of query heads)"
            )
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    f"choose n_heads among the divisors of d_model, or set d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        _positive_int("d_head", self.d_head)
        if self.d_embed is None:
            object.__setattr__(self, "d_embed", self.d_model)
        _positive_int("d_embed", self.d_embed)
        for name in ("relative_buckets", "relative_max_distance"):
            _positive_int(name, getattr(self, name))
        if self.pos_encoding == "relative" and not 4 <= self.relative_buckets < 2 * self.relative_max_distance:
            raise ConfigError(
                f"relative_buckets={self.relative_buckets} must be >= 4 and < 2 * relative_max_distance "
                f"(= {2 * self.relative_max_distance}): half the buckets of each direction are exact distances"
            )
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.d_head)
        _positive_int("rotary_dim", self.rotary_dim)
        if self.pos_encoding == "rotary" and (self.rotary_dim % 2 or self.rotary_dim > self.d_head):
            raise ConfigError(
                f"rotary positions rotate pairs of dimensions: rotary_dim={self.rotary_dim} must be even "
                f"and at most d_head={self.d_head}"
            )
        self._check_rotary_and_attention()
        self._check_residual_and_experts()
        if self.pos_encoding == "sinusoidal" and self.d_model % 2:
            raise ConfigError(f"sinusoidal positions come in sin/cos pairs: d_model={self.d_model} must be even")
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if value is not None and not (0.0 <= value < 1.0):
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        if isinstance(self.type_vocab_size, bool) or not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size must be an integer >= 0 (0: no token types), got {self.type_vocab_size!r}")
        if isinstance(self.pos_offset, bool) or not isinstance(self.pos_offset, int) or self.pos_offset < 0:
            raise ConfigError(f"pos_offset must be an integer >= 0, got {self.pos_offset!r}")
        if self.pos_offset and self.pos_encoding != "learned":
            raise ConfigError(
                f"pos_offset={self.pos_offset} shifts rows of a learned table; pos_encoding is {self.pos_encoding!r}"
            )
        _positive_float("norm_eps", self.norm_eps)
        for name in SPECIAL_TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise ConfigError(f"{name}={value!r} is outside [0, vocab_size={self.vocab_size})")
        uneven = any(getattr(self, name) != getattr(self, encoder) for name, encoder in DECODER_SIZES.items())
        if self.arch == "encoder-decoder" and uneven:
            try:
                self.decoder_config()
            except ConfigError as error:
                raise ConfigError(f"the decoder stack (decoder_* fields): {error}") from None

    def _check_rotary_and_attention(self) -> None:
        for name in ("rope_theta", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            _positive_float(name, getattr(self, name))
        if self.rope_scaling == "llama3" and not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ConfigError(
                "llama3 rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
                f"{self.rope_low_freq_factor} and {self.rope_high_freq_factor}"
            )
        _positive_int("rope_original_max_len", self.rope_original_max_len)
        for name in ("rope_local_theta", "query_pre_attn_scalar", "attn_softcap", "final_logit_softcap"):
            if getattr(self, name) is not None:
                _positive_float(f"{name} (or None)", getattr(self, name))
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", ("sliding" if self.sliding_window else "full",) * self.n_layers)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))  # a list when read from JSON
        for kind in self.layer_types:
            _choice("layer_types[...]", kind, LAYER_TYPES)
        if len(self.layer_types) != self.n_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for n_layers={self.n_layers}")
        if "sliding" in self.layer_types and self.sliding_window is None:
            raise ConfigError("layer_types has 'sliding' layers but sliding_window is None; give the window width")

    def _check_residual_and_experts(self) -> None:
        if self.parallel_residual and self.norm_position != "pre":
            raise ConfigError(f"parallel_residual needs norm_position='pre', got {self.norm_position!r}")
        if self.parallel_shared_norm and not self.parallel_residual:
            raise ConfigError("parallel_shared_norm needs parallel_residual=True (one norm for the two parallel branches)")
        if self.norm_plus_one and self.norm != "rmsnorm":
            raise ConfigError(f"norm_plus_one scales an RMSNorm by (1 + w); it needs norm='rmsnorm', got {self.norm!r}")
        if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int) or self.n_experts < 0:
            raise ConfigError(f"n_experts must be an integer >= 0 (0: one feed-forward network), got {self.n_experts!r}")
        if self.n_experts:
            _positive_int("n_experts_per_token", self.n_experts_per_token)
            if self.n_experts_per_token > self.n_experts:
                raise ConfigError(
                    f"n_experts_per_token={self.n_experts_per_token} must be at most n_experts={self.n_experts}"
                )

    # derived values --------------------------------------------------------------------------
    @property
    def effective_attn_dropout(self) -> float:
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    def decoder_config(self) -> "ModelConfig":
        """An encoder-decoder's decoder stack: this config with the decoder's depth, heads and d_ff.

        With as many heads as the encoder, the decoder's heads are the encoder's (d_head, n_kv_heads);
        with another number, each is d_model / decoder_n_heads wide with its own key/value head
        (Marian, BART). Layer types follow sliding_window, for the decoder's depth.
        """
        if self.arch != "encoder-decoder":
            raise ConfigError(
                f"decoder_config() is the decoder stack of an encoder-decoder; this config has arch={self.arch!r}"
            )
        sizes = {encoder_name: getattr(self, name) for name, encoder_name in DECODER_SIZES.items()}
        heads = {} if self.decoder_n_heads == self.n_heads else dict(d_head=None, n_kv_heads=None, rotary_dim=None)
        return self.replace(**sizes, **{name: sizes[encoder_name] for name, encoder_name in DECODER_SIZES.items()},
                            **heads, layer_types=None)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes`; fields that were derived (d_head, n_kv_heads, head, final_norm)
        are derived again unless given, so `cfg.replace(n_heads=8)` gets a matching d_head."""
        data = self.to_dict()
        for name in self._derived:
            data[name] = None
        data.update(changes)
        return ModelConfig.from_dict(data)

    # serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config fields {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "ModelConfig":
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))


# Presets -------------------------------------------------------------------------------------
# Shapes only: weights come from build_model (random) or from_pretrained (a checkpoint).

PRESETS: dict[str, ModelConfig] = {
    # "Attention Is All You Need", Table 3, base model: post-norm, ReLU, sinusoids, shared embeddings.
    "paper-base": ModelConfig(
        arch="encoder-decoder", vocab_size=37000, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
        max_seq_len=512, pos_encoding="sinusoidal", norm="layernorm", norm_position="post",
        activation="relu", dropout=0.1, scale_embeddings=True, norm_eps=1e-6,
    ),
    # BERT-base: post-norm, GELU, learned positions, token types, a norm after the embeddings.
    "bert-base": ModelConfig(
        arch="encoder", vocab_size=30522, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
        max_seq_len=512, pos_encoding="learned", norm="layernorm", norm_position="post",
        activation="gelu", dropout=0.1, norm_eps=1e-12, embed_norm=True, type_vocab_size=2,
        head="masked-lm", lm_head_bias=True, lm_head_transform=True, pooler=True, pad_token_id=0,
    ),
    # GPT-2 small: pre-norm, tanh-GELU, learned positions, final norm, tied LM head.
    "gpt2-small": ModelConfig(
        arch="decoder", vocab_size=50257, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
        max_seq_len=1024, pos_encoding="learned", norm="layernorm", norm_position="pre",
        activation="gelu_tanh", dropout=0.1, norm_eps=1e-5,
    ),
    # The worked example of Alejandro Armas, "What are Transformers" (2024): d_model 4, 2 heads, d_ff 8, 2 layers, the paper's block.
    "toy": ModelConfig(
        arch="decoder", vocab_size=7, d_model=4, n_heads=2, n_layers=2, d_ff=8,
        max_seq_len=16, pos_encoding="sinusoidal", norm="layernorm", norm_position="post",
        activation="relu", final_norm=False,
    ),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, optionally with fields replaced: `preset("toy", arch="encoder")`."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name].replace(**overrides)
