"""The three families: encoder-only, decoder-only and encoder-decoder, built from one stack.

Shape letters: B batch, T positions (target), S source positions, E model width, V vocabulary.

A Stack is: token embeddings (+ positions, + token types) -> N blocks -> optional final norm.
- EncoderModel  = a bidirectional Stack + a head (masked-LM, sequence or token classification);
- DecoderModel  = a causal Stack + an LM head;
- EncoderDecoderModel = an encoder Stack, a causal decoder Stack whose blocks add cross-attention
  to the encoder output, and an LM head (the paper, figure 1).

Masks are built once per forward pass here, at the model level, and shared by every block.
The heads (LMHead, Pooler, pool) are in heads.py.
"""

from __future__ import annotations

import importlib
import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import masks
from .blocks import Block
from .cache import KVCache
from .config import ModelConfig
from .heads import LMHead, Pooler, pool
from .initialization import drawing_from, init_weights
from .inputs import InputError, check_ids, check_mask, check_token_types
from .layers import Dropout, Projection, make_norm
from .positional import (
    LearnedPositions, RelativePositionBias, RotaryEmbedding, SinusoidalPositions, alibi_bias, alibi_slopes,
)
from .trace import TracePoint


# Outputs: one dataclass per family ------------------------------------------------------------

@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # [B, T, E]
    logits: torch.Tensor | None  # [B, T, V] (masked-LM), [B, labels] or [B, T, labels]; None without a head
    pooled: torch.Tensor | None = None  # [B, E] when the model pools (classification, or a pooler)


@dataclass
class DecoderOutput:
    logits: torch.Tensor | None  # [B, T, V]
    last_hidden_state: torch.Tensor  # [B, T, E]
    cache: KVCache | None = None


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor  # [B, T, V]
    last_hidden_state: torch.Tensor  # decoder output [B, T, E]
    encoder_last_hidden_state: torch.Tensor  # [B, S, E]
    cache: KVCache | None = None


# The stack -------------------------------------------------------------------------------------

class Stack(nn.Module):
    """Embeddings, then n_layers blocks, then (pre-norm) a final norm.

    Trace points: embed (token embeddings, scaled if configured), pos_embed, type_embed
    [batch pos d_model], then each block's, then final_norm.out.
    """

    def __init__(self, config: ModelConfig, *, causal: bool, cross_attention: bool = False,
                 token_embedding: nn.Embedding | None = None):
        super().__init__()
        self.config = config
        self.causal = causal
        self.token_embedding = token_embedding or nn.Embedding(config.vocab_size, config.d_embed)
        if config.d_embed != config.d_model:  # narrower embeddings, projected in and out (OPT-350m)
            self.project_in = Projection(config.d_embed, config.d_model)
            self.project_out = Projection(config.d_model, config.d_embed)
        self.embed = TracePoint("batch pos d_model")
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        if config.pos_encoding == "learned":
            self.position_embedding = LearnedPositions(config.max_seq_len, config.d_model, config.pos_offset)
        elif config.pos_encoding == "sinusoidal":
            self.position_embedding = SinusoidalPositions(config.max_seq_len, config.d_model, config.sinusoid_layout)
        if config.pos_encoding in ("learned", "sinusoidal"):
            self.pos_embed = TracePoint("batch pos d_model")
        if config.type_vocab_size:
            self.token_type_embedding = nn.Embedding(config.type_vocab_size, config.d_model)
            self.type_embed = TracePoint("batch pos d_model")
        if config.embed_norm:
            self.embed_norm = make_norm(config)
        self.embed_dropout = Dropout(config.dropout)
        rotary = {"full": None, "sliding": None}  # by layer type: the sliding layers may have their own base
        if config.pos_encoding == "rotary":
            rotary["full"] = rotary["sliding"] = RotaryEmbedding.from_config(config)
            if config.rope_local_theta is not None:
                rotary["sliding"] = RotaryEmbedding.from_config(config, local=True)
        if config.pos_encoding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(config.n_heads), persistent=False)
        if config.pos_encoding == "relative":  # one table for the whole stack; the encoder's looks both ways
            self.relative_position_bias = RelativePositionBias(
                config.relative_buckets, config.n_heads, config.relative_max_distance, bidirectional=not causal
            )
            self.position_bias = TracePoint("head query key")
        self.blocks = nn.ModuleList(
            Block(config, i, cross_attention=cross_attention, rotary=rotary[kind])
            for i, kind in enumerate(config.layer_types)
        )
        if config.final_norm:
            self.final_norm = make_norm(config)

    @property
    def max_positions(self) -> int | None:
        """How many positions the position tables cover (None: unbounded, ALiBi or no positions)."""
        return self.config.max_seq_len if self.config.pos_encoding in ("learned", "sinusoidal", "rotary") else None

    def run(
        self,
        input_ids: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T] (already checked) -> hidden states [B, T, E]."""
        config = self.config
        n_new = input_ids.size(1)
        past = cache.length if cache is not None else 0
        if position_ids is None and config.positions_from_padding and padding_mask is not None:
            # Count real tokens only: a left-padded row numbers its first real token 0.
            position_ids = (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, past:]  # (B, T)
        elif position_ids is None:
            position_ids = torch.arange(past, past + n_new, device=input_ids.device)  # (T,)

        # X = E + P (+ token types): the input of the first block.
        x = self.embed(self.token_embedding(input_ids) * self.embed_scale)  # (B, T, E)
        if hasattr(self, "project_in"):
            x = self.project_in(x)  # (B, T, d_embed) -> (B, T, E)
        if hasattr(self, "position_embedding"):
            x = x + self.pos_embed(self.position_embedding(position_ids).expand_as(x))
        if hasattr(self, "token_type_embedding"):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.type_embed(self.token_type_embedding(token_type_ids))
        if hasattr(self, "embed_norm"):
            x = self.embed_norm(x)
        x = self.embed_dropout(x)

        layer_masks, bias = self.attention_inputs(padding_mask, n_new, past=past, device=input_ids.device, dtype=x.dtype)
        memory_mask = masks.cross_attention_mask(memory_padding_mask)
        for block, kind in zip(self.blocks, config.layer_types):
            mask, is_causal = layer_masks[kind]
            x = block(
                x, mask=mask, is_causal=is_causal, position_ids=position_ids, bias=bias,
                memory=memory, memory_mask=memory_mask, cache=cache,
            )
        if cache is not None:
            cache.advance()
        if hasattr(self, "final_norm"):
            x = self.final_norm(x)
        if hasattr(self, "project_out"):
            x = self.project_out(x)  # (B, T, E) -> (B, T, d_embed), the width of the LM head
        return x

    def attention_inputs(self, padding_mask: torch.Tensor | None, n_new: int, *, past: int = 0, device=None,
                         dtype: torch.dtype = torch.float32) -> tuple[dict, torch.Tensor | None]:
        """What every block's self-attention reads besides x, built once per pass for n_new queries
        after `past` cached keys: ({layer kind: (mask, is_causal)}, the position bias [H, T, S] of
        ALiBi or T5, else None). padding_mask [B, past + T]."""
        config = self.config
        # One (mask, is_causal) per kind of layer: "full" sees every earlier key, "sliding" the last few.
        layer_masks = {
            kind: masks.self_attention_mask(
                padding_mask, n_new, causal=self.causal, past_length=past, device=device,
                window=config.sliding_window if kind == "sliding" else None,
            )
            for kind in set(config.layer_types)
        }
        bias = None
        if config.pos_encoding == "alibi":
            # Distances between slots in the sequence: unchanged by left padding, so no position_ids.
            key_positions = torch.arange(past + n_new, device=device)
            bias = alibi_bias(self.alibi_slopes, key_positions[past:], key_positions).to(dtype)  # (H, T, S)
        if config.pos_encoding == "relative":  # between slots too, as T5 measures them
            key_positions = torch.arange(past + n_new, device=device)
            bias = self.position_bias(self.relative_position_bias(key_positions[past:], key_positions).to(dtype))
        return layer_masks, bias

    def check_inputs(self, name: str, ids, mask, mask_name: str, cache: KVCache | None = None) -> None:
        past = cache.length if cache is not None else 0
        check_ids(name, ids, vocab_size=self.config.vocab_size, max_positions=self.max_positions, past_length=past)
        if cache is not None:
            cache.check_room(ids.size(1))
        check_mask(mask_name, mask, shape=(ids.size(0), past + ids.size(1)), ids_name=name
                   + (f" plus {past} cached positions" if past else ""))


# Writing checkpoints is the job of the checkpoints floor, which registers its writer here when it
# is imported (on first use, below, if nothing imported it yet): the core imports no floor by name.
_SAVERS: list = []
SAVING_FLOOR = "anatomy.checkpoints.save"


def register_saver(save) -> None:
    """Make `save(model, directory, **options) -> Path` the writer behind model.save_pretrained."""
    _SAVERS[:] = [save]


class _Saveable:
    def save_pretrained(self, directory: str | Path, **kwargs) -> Path:
        """Write the model to `directory`: anatomy.save_pretrained(model, directory, **kwargs)."""
        if not _SAVERS:
            importlib.import_module(SAVING_FLOOR)  # registers its writer
        return _SAVERS[0](self, directory, **kwargs)


# Families ---------------------------------------------------------------------------------------

class EncoderModel(Stack, _Saveable):
    """Encoder-only, bidirectional: every token attends to every real token (BERT; the "3 Transformer Anatomy" notes).

    forward(input_ids [B, T], padding_mask [B, T] bool (True = real token), token_type_ids [B, T])
    -> EncoderOutput. Trace points after the stack: pooled [batch d_model], logits.
    """

    def __init__(self, config: ModelConfig):
        if config.arch != "encoder":
            raise ValueError(f"EncoderModel needs arch='encoder', got {config.arch!r}")
        super().__init__(config, causal=False)
        if config.pooler or config.head == "sequence-classification":
            self.pooled = TracePoint("batch d_model")
        if config.pooler:
            self.pooler = Pooler(config.d_model, config.pooler_activation)
        if config.head == "masked-lm":
            self.lm_head = LMHead(config, self.token_embedding)
        elif config.head in ("sequence-classification", "token-classification"):
            self.classifier_dropout = Dropout(config.dropout)
            self.classifier = nn.Linear(config.d_model, config.num_labels)
        logit_axes = {"sequence-classification": "batch label", "token-classification": "batch pos label"}
        self.logits = TracePoint(logit_axes.get(config.head, "batch pos vocab"))

    def forward(self, input_ids, padding_mask=None, token_type_ids=None, position_ids=None) -> EncoderOutput:
        self.check_inputs("input_ids", input_ids, padding_mask, "padding_mask")
        check_token_types(token_type_ids, shape=tuple(input_ids.shape), type_vocab_size=self.config.type_vocab_size)
        hidden = self.run(input_ids, padding_mask=padding_mask, token_type_ids=token_type_ids, position_ids=position_ids)
        pooled = None
        if hasattr(self, "pooled"):
            pooled = pool(hidden, padding_mask, self.config.pooling)
            if hasattr(self, "pooler"):
                pooled = self.pooler(pooled)
            pooled = self.pooled(pooled)
        head = self.config.head
        logits = None
        if head == "masked-lm":
            logits = self.lm_head(hidden)
        elif head == "sequence-classification":
            logits = self.classifier(self.classifier_dropout(pooled))  # (B, labels)
        elif head == "token-classification":
            logits = self.classifier(self.classifier_dropout(hidden))  # (B, T, labels)
        if logits is not None:
            logits = self.logits(logits)
        return EncoderOutput(last_hidden_state=hidden, logits=logits, pooled=pooled)


class DecoderModel(Stack, _Saveable):
    """Decoder-only, causal: token t attends to tokens 0..t (GPT-2, Llama, Armas's toy).

    forward(input_ids [B, T], padding_mask [B, past + T] bool, cache=None) -> DecoderOutput.
    With a cache (model.new_cache()), only the new tokens are given and their keys and values
    are appended; the logits equal those of the full pass.
    """

    def __init__(self, config: ModelConfig):
        if config.arch != "decoder":
            raise ValueError(f"DecoderModel needs arch='decoder', got {config.arch!r}")
        super().__init__(config, causal=True)
        if config.head == "lm":
            self.lm_head = LMHead(config, self.token_embedding)
            self.logits = TracePoint("batch pos vocab")

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.config.n_layers, capacity or self.config.max_seq_len)

    def forward(self, input_ids, padding_mask=None, position_ids=None, cache: KVCache | None = None) -> DecoderOutput:
        self.check_inputs("input_ids", input_ids, padding_mask, "padding_mask", cache)
        hidden = self.run(input_ids, padding_mask=padding_mask, position_ids=position_ids, cache=cache)
        logits = self.logits(self.lm_head(hidden)) if hasattr(self, "lm_head") else None
        return DecoderOutput(logits=logits, last_hidden_state=hidden, cache=cache)

    def loss(self, input_ids, padding_mask=None, targets=None, *, ignore_index: int = -100,
             label_smoothing: float = 0.0, reduction: str = "mean") -> torch.Tensor:
        """Mean next-token cross-entropy: position t is scored on token t + 1 (or on targets[:, t]).

        Equals F.cross_entropy of forward(input_ids).logits (with the same ignore_index,
        label_smoothing and reduction), but through LMHead.loss: the [B, T, V] logits are never
        held at once (the fast training step of BENCHMARKS.md). Without targets, the last position
        and any position next to padding have none (ignore_index). The `logits` trace point is not
        reached; trace through forward to see them.
        """
        if not hasattr(self, "lm_head"):
            raise ValueError("loss needs an LM head; this model has head='none'")
        self.check_inputs("input_ids", input_ids, padding_mask, "padding_mask")
        if targets is not None and tuple(targets.shape) != tuple(input_ids.shape):
            raise InputError(f"targets has shape {tuple(targets.shape)} but input_ids has {tuple(input_ids.shape)}")
        if targets is None:
            targets = F.pad(input_ids[:, 1:], (0, 1), value=ignore_index)  # (B, T): the next token
            if padding_mask is not None:
                both_real = F.pad(padding_mask[:, 1:] & padding_mask[:, :-1], (0, 1), value=False)
                targets = targets.masked_fill(~both_real, ignore_index)
        return self.lm_head.loss(self.run(input_ids, padding_mask=padding_mask), targets, ignore_index,
                                 label_smoothing=label_smoothing, reduction=reduction)


class EncoderDecoderModel(nn.Module, _Saveable):
    """The paper's model: an encoder reads the source, a decoder writes the target.

    forward(src_ids [B, S], tgt_ids [B, T], src_padding_mask [B, S], tgt_padding_mask [B, T])
    -> Seq2SeqOutput. The decoder's cross-attention scores are rectangular, [B, H, T, S].
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "encoder-decoder":
            raise ValueError(f"EncoderDecoderModel needs arch='encoder-decoder', got {config.arch!r}")
        self.config = config
        self.encoder = Stack(config, causal=False)
        shared = self.encoder.token_embedding if config.share_encoder_decoder_embeddings else None
        # The decoder may be deeper, shallower or have other heads and d_ff than the encoder.
        self.decoder = Stack(config.decoder_config(), causal=True, cross_attention=True, token_embedding=shared)
        self.lm_head = LMHead(config, self.decoder.token_embedding)
        self.logits = TracePoint("batch pos vocab")

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.config.decoder_n_layers, capacity or self.config.max_seq_len)

    def encode(self, src_ids, src_padding_mask=None) -> torch.Tensor:
        """src_ids [B, S] -> memory [B, S, E], the encoder output every decoder layer attends to."""
        self.encoder.check_inputs("src_ids", src_ids, src_padding_mask, "src_padding_mask")
        return self.encoder.run(src_ids, padding_mask=src_padding_mask)

    def decode(self, tgt_ids, memory, src_padding_mask=None, tgt_padding_mask=None, cache=None) -> torch.Tensor:
        """tgt_ids [B, T] and memory [B, S, E] -> logits [B, T, V]."""
        self.decoder.check_inputs("tgt_ids", tgt_ids, tgt_padding_mask, "tgt_padding_mask", cache)
        if memory.size(0) != tgt_ids.size(0):
            raise ValueError(f"memory has batch {memory.size(0)} but tgt_ids has batch {tgt_ids.size(0)}")
        hidden = self.decoder.run(
            tgt_ids, padding_mask=tgt_padding_mask, memory=memory, memory_padding_mask=src_padding_mask, cache=cache
        )
        return hidden, self.logits(self.lm_head(hidden))

    def forward(self, src_ids, tgt_ids, src_padding_mask=None, tgt_padding_mask=None,
                cache: KVCache | None = None, memory: torch.Tensor | None = None) -> Seq2SeqOutput:
        """With `memory` (from encode) the encoder is not run again: incremental decoding."""
        if memory is None:
            memory = self.encode(src_ids, src_padding_mask)
        elif src_padding_mask is not None:
            check_mask("src_padding_mask", src_padding_mask, shape=tuple(memory.shape[:2]), ids_name="memory")
        hidden, logits = self.decode(tgt_ids, memory, src_padding_mask, tgt_padding_mask, cache)
        return Seq2SeqOutput(logits=logits, last_hidden_state=hidden, encoder_last_hidden_state=memory, cache=cache)

    def loss(self, src_ids, tgt_ids, targets, src_padding_mask=None, tgt_padding_mask=None, *,
             ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean") -> torch.Tensor:
        """F.cross_entropy of forward(src_ids, tgt_ids, ...).logits against targets [B, T] (teacher
        forcing), through LMHead.loss: the [B, T, V] logits are never held at once."""
        memory = self.encode(src_ids, src_padding_mask)
        self.decoder.check_inputs("tgt_ids", tgt_ids, tgt_padding_mask, "tgt_padding_mask")
        if tuple(targets.shape) != tuple(tgt_ids.shape):
            raise InputError(f"targets has shape {tuple(targets.shape)} but tgt_ids has {tuple(tgt_ids.shape)}")
        hidden = self.decoder.run(tgt_ids, padding_mask=tgt_padding_mask, memory=memory,
                                  memory_padding_mask=src_padding_mask)  # (B, T, E)
        return self.lm_head.loss(hidden, targets, ignore_index, label_smoothing=label_smoothing, reduction=reduction)


FAMILIES = {"encoder": EncoderModel, "decoder": DecoderModel, "encoder-decoder": EncoderDecoderModel}


def build_model(config: ModelConfig, *, seed: int | None = None) -> nn.Module:
    """A randomly initialised model of the family config.arch names (initialization.py). With `seed`,
    every draw comes from a generator of the build's own: the same seed gives the same weights in
    any thread, and torch's global generator is left as it was; without it, from torch's global one."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model takes a ModelConfig, got {type(config).__name__}")
    own = nullcontext() if seed is None else drawing_from(torch.Generator().manual_seed(seed))
    with own:
        model = FAMILIES[config.arch](config)
        init_weights(model)
    return model
