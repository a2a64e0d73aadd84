"""The three families: encoder-only, decoder-only and encoder-decoder, built from one stack.

Shape letters: B batch, T positions (target), S source positions, E model width, V vocabulary.

A Stack is: token embeddings (+ positions, + token types) -> N blocks -> optional final norm.
- EncoderModel  = a bidirectional Stack + a head (masked-LM, sequence or token classification);
- DecoderModel  = a causal Stack + an LM head;
- EncoderDecoderModel = an encoder Stack, a causal decoder Stack whose blocks add cross-attention
  to the encoder output, and an LM head (the paper, figure 1).

The stack (stack.py) builds the masks once per forward pass, at the model level, and shares them with
every block; it also runs from any layer (Stack.run_from). The heads (LMHead, Pooler, pool) are in heads.py.
"""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVCache
from .config import ModelConfig
from .heads import LMHead, Pooler, pool
from .initialization import drawing_from, init_weights
from .inputs import InputError, check_mask, check_token_types
from .layers import Dropout
from .stack import Stack
from .trace import TracePoint

__all__ = ["DecoderModel", "DecoderOutput", "EncoderDecoderModel", "EncoderModel", "EncoderOutput", "FAMILIES",
           "Seq2SeqOutput", "Stack", "build_model", "pool", "register_saver"]


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
        return self.outputs(hidden, padding_mask)

    def outputs(self, hidden: torch.Tensor, padding_mask=None) -> EncoderOutput:
        """The pooling and the head on the stack's hidden states [B, T, E] (forward's last step; after
        Stack.run_from, the same outputs from a resumed run)."""
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
