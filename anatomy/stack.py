"""The stack every family is built from: embeddings, n_layers blocks, an optional final norm; and the
same stack run from any layer, given the residual stream there (where patching starts).

Shape letters: B batch, T positions, S source positions, E model width.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import masks
from .blocks import Block
from .cache import KVCache
from .config import ModelConfig
from .inputs import check_ids, check_mask
from .layers import Dropout, Projection, make_norm
from .positional import (
    LearnedPositions, RelativePositionBias, RotaryEmbedding, SinusoidalPositions, alibi_bias, alibi_slopes,
)
from .trace import TracePoint


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
        past = cache.length if cache is not None else 0
        position_ids = self._positions(input_ids, padding_mask, position_ids, past)

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
        return self._blocks(0, x, padding_mask, position_ids, memory, memory_padding_mask, cache)

    def run_from(
        self,
        layer: int,
        resid: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        past: KVCache | None = None,
    ) -> torch.Tensor:
        """The stack from block `layer` on, given the residual stream resid [B, T, E] at that block's input
        (what blocks.{layer}.resid_pre holds in a full pass) -> hidden states [B, T, E], as run() returns.

            run(ids) == run_from(l, resid_pre of layer l in run(ids))    for every l in 0..n_layers

        (l = n_layers: the final norm alone). Patching starts here: a run that differs from a cached one
        only from layer l on need not compute the layers before it. The blocks' trace points from layer
        l on fire as in a full pass; those before it and the embeddings' do not. past: a KVCache holding the
        keys and values of the first P positions (KVCache.holding), resid then the stream of the positions
        after them, [B, T - P, E], and padding_mask [B, T]: a causal run that differs from a cached one only
        from position P on computes those positions alone (the cache is appended to). Raises ValueError for
        a layer outside 0..n_layers or a stream of the wrong width."""
        n_layers = len(self.blocks)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
            raise ValueError(f"layer must be an integer from 0 to {n_layers} (the stack's blocks), got {layer!r}")
        if not torch.is_tensor(resid) or resid.dim() != 3 or resid.size(-1) != self.config.d_model:
            shape = tuple(resid.shape) if torch.is_tensor(resid) else type(resid).__name__
            raise ValueError(f"resid must be the residual stream [batch, pos, {self.config.d_model}], got {shape}")
        done = 0 if past is None else past.length
        if padding_mask is not None:
            check_mask("padding_mask", padding_mask, shape=(resid.size(0), done + resid.size(1)), ids_name="resid")
        position_ids = self._positions(resid[..., 0], padding_mask, position_ids, done)
        return self._blocks(layer, resid, padding_mask, position_ids, memory, memory_padding_mask, past)

    def _positions(self, ids: torch.Tensor, padding_mask, position_ids, past: int) -> torch.Tensor:
        """Each position's index for the position tables: given, counted over real tokens only (a
        left-padded row numbers its first real token 0), or past .. past + T - 1."""
        if position_ids is None and self.config.positions_from_padding and padding_mask is not None:
            return (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, past:]  # (B, T)
        if position_ids is None:
            return torch.arange(past, past + ids.size(1), device=ids.device)  # (T,)
        return position_ids

    def _blocks(self, start: int, x, padding_mask, position_ids, memory, memory_padding_mask, cache) -> torch.Tensor:
        """Blocks start.. on x [B, T, E], then the final norm (and the projection out) -> [B, T, E]."""
        past = cache.length if cache is not None else 0
        layer_masks, bias = self.attention_inputs(padding_mask, x.size(1), past=past, device=x.device, dtype=x.dtype)
        memory_mask = masks.cross_attention_mask(memory_padding_mask)
        for block, kind in zip(self.blocks[start:], self.config.layer_types[start:]):
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
