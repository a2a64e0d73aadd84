"""Generation: turning a model that scores the next token into one that writes.

Shape letters: B batch (prompts), W beams per prompt, T positions, V vocabulary.

A decoder gives p(x_t | x_<t). Generation repeats one step: compute the next-token distribution,
choose a token, append it, until a stop token or the length limit. Only the choice differs
(greedy, sampling, beam search: search.py, sampling.py); the step itself, with its KV cache and
its sliding window past the context, is runner.py.

Batches of prompts of different lengths are *left*-padded for a decoder-only model, so that every
row's next token goes in the same column. The padding mask hides the pads from attention and the
position ids count real tokens only, so a padded row generates exactly what it would alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import torch
from torch import nn

from ..models import EncoderDecoderModel
from .checks import STRATEGIES, check_arguments, check_memory, stop_ids
from .runner import Runner
from .sampling import sampling_distribution
from .search import GenerationOutput, beam_search, one_path

__all__ = ["STRATEGIES", "GenerationOutput", "generate"]

Streamer = Callable[[list[int]], None]


def generate(
    model: nn.Module,
    input_ids: torch.Tensor | None = None,
    *,
    messages: list[dict] | None = None,
    padding_mask: torch.Tensor | None = None,
    src_ids: torch.Tensor | None = None,
    src_padding_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    strategy: str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    stop_tokens: int | Iterable[int] | None = None,
    pad_token_id: int | None = None,
    decoder_start_token_id: int | None = None,
    use_cache: bool = True,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
) -> GenerationOutput:
    """Generate up to `max_new_tokens` tokens after each prompt.

    Decoder-only: input_ids [B, T] is the prompt; a batch of prompts of different lengths is
    left-padded, with padding_mask [B, T] (True = real token).
    Encoder-decoder: src_ids [B, S] (and src_padding_mask [B, S]) is the source, encoded once;
    the decoder starts from decoder_start_token_id (default: model.config.decoder_start_token_id,
    read from config.json by from_pretrained), or from input_ids [B, T] if given (a forced prefix).

    strategy: "greedy", "sample" or "beam"; None means "beam" when num_beams > 1, else "greedy".
    Sampling uses temperature, top_k and top_p (see `sampling_distribution`) and draws from
    `generator`, or from a new torch.Generator seeded with `seed`; without either, a fresh seed is
    drawn from the operating system and returned in `.seed`. The global RNG is never used.
    Beam search keeps num_beams hypotheses per prompt and returns the best by
    log p / length^length_penalty, length counting the new tokens including the stop token.
    With one beam it is greedy search (exactly so when length_penalty=0 or without stop tokens).

    stop_tokens: an id or ids (e.g. EOS) that end a row; the stop token is kept, and the row is
    then filled with pad_token_id (default: model.config.pad_token_id, else the first stop
    token, else 0). Generation ends when every row has stopped.

    Length: past the model's context (max_seq_len, for positions from a table: learned,
    sinusoidal, rotary) the window slides, as in nanoGPT: each later step sees the last max_seq_len
    tokens, recomputed from scratch, and the output's `window_slid` says it happened. A prompt
    longer than the context is cropped the same way. Buffers that would not fit in the memory
    available are refused before anything is allocated.

    use_cache: True (default) runs the prompt once and then one token per step through a KV cache
    of prompt + max_new_tokens positions (at most max_seq_len); False recomputes the whole sequence
    each step.
    streamer: called after every step with the list of the B tokens just chosen (greedy, sample).

    messages: a conversation, [{"role": "system" | "user" | "assistant", "content": str}, ...], for
    a chat model (instead of input_ids): it is written in the checkpoint's own chat template
    (model.tokenizer.apply_chat_template) followed by the assistant's header, and generation stops
    at the template's end of turn (unless stop_tokens says otherwise). The answer is `.texts[0]`.
    `.texts` holds each row's new tokens as text whenever the model carries its tokenizer.

    The model runs in eval mode under torch.inference_mode (its mode is restored afterwards).
    Raises ValueError for any argument outside its allowed values, naming them, and for NaN logits.
    """
    tokenizer = getattr(model, "tokenizer", None)
    if messages is not None:
        if input_ids is not None:
            raise ValueError("give either input_ids or messages, not both")
        if tokenizer is None:
            raise ValueError("messages need the model's tokenizer: load the model with anatomy.from_pretrained")
        device = next(model.parameters()).device
        input_ids = torch.tensor([tokenizer.encode_chat(messages)], device=device)
        if stop_tokens is None:
            stop_tokens = tokenizer.turn_end_ids() or None
    if strategy is None:
        strategy = "beam" if isinstance(num_beams, int) and num_beams > 1 else "greedy"
    check_arguments(model, input_ids, padding_mask, src_ids, src_padding_mask, strategy=strategy,
                    max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    num_beams=num_beams, length_penalty=length_penalty, pad_token_id=pad_token_id,
                    decoder_start_token_id=decoder_start_token_id, use_cache=use_cache, streamer=streamer,
                    seed=seed, generator=generator)
    stops = stop_ids(stop_tokens, model.config.vocab_size)
    config = model.config
    device = next(model.parameters()).device
    encoder_decoder = isinstance(model, EncoderDecoderModel)
    if pad_token_id is None:
        pad_token_id = config.pad_token_id if config.pad_token_id is not None else (stops[0] if stops else 0)

    if encoder_decoder and input_ids is None:
        if decoder_start_token_id is None:  # set by the caller, or by the model's config
            decoder_start_token_id = config.decoder_start_token_id
        if decoder_start_token_id is None:
            raise ValueError("an encoder-decoder model needs decoder_start_token_id (e.g. the <SOS> id), "
                             "or input_ids to start the decoder from")
        input_ids = torch.full((src_ids.size(0), 1), decoder_start_token_id, dtype=torch.long, device=device)
    batch, prompt_length = input_ids.shape
    total = prompt_length + max_new_tokens
    check_memory(model, batch * num_beams, total, num_beams, use_cache)

    if strategy == "sample" and generator is None:
        if seed is None:
            seed = random.SystemRandom().randrange(2 ** 63)  # fresh entropy, global RNGs untouched
        generator = torch.Generator(device=device).manual_seed(seed)

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            memory = memory_mask = None
            if encoder_decoder:
                memory = model.encode(src_ids, src_padding_mask)  # (B, S, E): the encoder runs once
                memory_mask = src_padding_mask
            full_mask = None
            if padding_mask is not None:
                # Columns of the new tokens are real: [B, prompt] -> [B, prompt + max_new_tokens].
                full_mask = torch.ones(batch, total, dtype=torch.bool, device=device)
                full_mask[:, :prompt_length] = padding_mask
            run = dict(model=model, use_cache=use_cache, capacity=total, padding_mask=full_mask, memory=memory,
                       memory_mask=memory_mask)
            stop_tensor = torch.tensor(stops, dtype=torch.long, device=device)
            if strategy == "beam":
                output = beam_search(input_ids, full_mask, run, max_new_tokens=max_new_tokens,
                                     num_beams=num_beams, length_penalty=length_penalty, stop_ids=stop_tensor,
                                     pad_token_id=pad_token_id)
            else:
                choose = (lambda logits: logits.argmax(dim=-1)) if strategy == "greedy" else (
                    lambda logits: torch.multinomial(
                        sampling_distribution(logits, temperature, top_k, top_p), 1, generator=generator
                    ).squeeze(-1)
                )
                output = one_path(input_ids, full_mask, Runner(**run), choose, max_new_tokens=max_new_tokens,
                                  stop_ids=stop_tensor, pad_token_id=pad_token_id, streamer=streamer)
    finally:
        model.train(was_training)
    output.seed = seed
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        output.texts = [tokenizer.decode(row[keep].tolist()) for row, keep in
                        zip(output.new_tokens, output.padding_mask[:, output.prompt_length:])]
    return output
