"""Generation: turning a model that scores the next token into one that writes.

Shape letters: B batch (prompts), K beams per prompt, T positions, V vocabulary.

A decoder gives p(x_t | x_<t). Generation repeats one step: compute the next-token distribution,
choose a token, append it, until a stop token or the length limit. Only the choice differs:

- greedy:   x_t = argmax_x p(x | x_<t)
- sample:   x_t ~ p(x | x_<t) after temperature, top-k and top-p (nucleus) filtering
- beam:     keep the K best partial sequences by sum_t log p(x_t | x_<t), extending every one of
            them by every token at each step, and rank finished ones by
            sum_t log p(x_t | x_<t) / length^alpha (alpha = length_penalty; Wu et al., 2016 use a
            variant of the same idea).

The KV cache (cache.py) makes each step cost one position instead of the whole sequence: the
prompt is run once ("prefill"), then each step feeds only the token just chosen. `use_cache=False`
recomputes the whole sequence at every step; it gives the same tokens, slowly, and is kept for
tests and for teaching.

Batches of prompts of different lengths are *left*-padded for a decoder-only model, so that every
row's next token goes in the same column. The padding mask hides the pads from attention and the
position ids count real tokens only, so a padded row generates exactly what it would alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..models import DecoderModel, EncoderDecoderModel

STRATEGIES = ("greedy", "sample", "beam")
Streamer = Callable[[list[int]], None]


@dataclass
class GenerationOutput:
    """What `generate` returns.

    sequences     [B, T]  the prompt (decoder-only, left padding included) or the decoder's start
                          token (encoder-decoder), followed by the new tokens; rows that stopped
                          early are filled with the pad id
    padding_mask  [B, T]  True = a real token (not left padding, not filling after a stop token)
    scores        [B]     what the strategy ranks by: the sum of log p(token) over the new tokens
                          (stop token included) for greedy and sample; that sum divided by
                          length^length_penalty for beam search
    finished      [B]     True where the row ended with a stop token (False: it hit max_new_tokens)
    prompt_length int     columns before the first new token: sequences[:, prompt_length:] are new
    seed          int | None  the seed the sampler's generator started from (sample only), so any
                          run can be repeated
    """

    sequences: torch.Tensor
    padding_mask: torch.Tensor
    scores: torch.Tensor
    finished: torch.Tensor
    prompt_length: int
    seed: int | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """[B, T - prompt_length]: only the generated columns."""
        return self.sequences[:, self.prompt_length:]


# Choosing the next token ------------------------------------------------------------------------

def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row and set the others to -inf. [..., V] -> [..., V].

    Tokens tied with the k-th largest logit are kept too (so a row may keep more than k).
    """
    k = min(k, logits.size(-1))
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most probable tokens
    whose total probability is at least p, set the others to -inf. [..., V] -> [..., V].

        V_p = the smallest V' (taken in order of decreasing probability) with sum_{x in V'} P(x) >= p

    Sorting the probabilities P_(1) >= P_(2) >= ..., token (i) is kept exactly when the tokens
    ranked above it hold less than p: sum_{j < i} P_(j) < p. The most probable token is always
    kept. p = 1 keeps every token.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    sorted_probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_above = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # sum_{j < i} P_(j)
    remove_sorted = mass_above >= p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, -math.inf)


def sampling_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> torch.Tensor:
    """logits [B, V] -> the probabilities that `sample` draws from, [B, V]:

        softmax(filter(logits / temperature))

    with the filters applied in the order top-k, then top-p. temperature < 1 sharpens the
    distribution (towards greedy), > 1 flattens it (towards uniform).
    """
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.softmax(logits, dim=-1)


# Checking the arguments ---------------------------------------------------------------------------

def _check_arguments(model, input_ids, padding_mask, src_ids, *, strategy, max_new_tokens, temperature,
                     top_k, top_p, num_beams, stop_tokens, streamer, seed, generator) -> None:
    """Every ValueError names the argument and the values it may take."""
    if not isinstance(model, (DecoderModel, EncoderDecoderModel)):
        raise TypeError(
            f"generate needs a DecoderModel or an EncoderDecoderModel (a model with an LM head), "
            f"got {type(model).__name__}"
        )
    if isinstance(model, DecoderModel) and not hasattr(model, "lm_head"):
        raise ValueError("this DecoderModel has head='none': generation needs head='lm'")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not supported; allowed values: {', '.join(map(repr, STRATEGIES))}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if strategy != "beam" and num_beams != 1:
        raise ValueError(f"num_beams={num_beams} needs strategy='beam' (strategy is {strategy!r})")
    if strategy == "sample":
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature!r} (use strategy='greedy' "
                             "for the limit temperature -> 0)")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")
        if seed is not None and generator is not None:
            raise ValueError("give either seed or generator, not both")
    else:
        given = [f"{name}={value!r}" for name, value, default in
                 (("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None),
                  ("seed", seed, None), ("generator", generator, None)) if value != default]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to strategy='sample' (strategy is {strategy!r})")
    if strategy == "beam" and streamer is not None:
        raise ValueError("streaming needs strategy 'greedy' or 'sample': a beam's tokens can still change")
    vocab_size = model.config.vocab_size
    for token in stop_tokens:
        if not 0 <= token < vocab_size:
            raise ValueError(f"stop token {token} is outside [0, vocab_size={vocab_size})")
    if isinstance(model, EncoderDecoderModel):
        if src_ids is None:
            raise ValueError("an encoder-decoder model needs src_ids (the source sequence) [B, S]")
        if padding_mask is not None:
            raise ValueError("padding_mask is for left-padded decoder-only prompts; an encoder-decoder batch "
                             "pads its sources instead (src_padding_mask)")
    else:
        if src_ids is not None:
            raise ValueError("src_ids are for encoder-decoder models; a decoder-only model takes input_ids")
        if input_ids is None:
            raise ValueError("a decoder-only model needs input_ids (the prompt) [B, T]")
    if input_ids is not None and not (torch.is_tensor(input_ids) and input_ids.dim() == 2
                                      and not input_ids.dtype.is_floating_point):
        raise ValueError("input_ids must be an integer tensor [batch, positions] of token ids, got "
                         + (f"shape {tuple(input_ids.shape)}, dtype {input_ids.dtype}" if torch.is_tensor(input_ids)
                            else type(input_ids).__name__))
    if padding_mask is not None and input_ids is not None:
        if not torch.is_tensor(padding_mask) or padding_mask.dtype != torch.bool \
                or padding_mask.shape != input_ids.shape:
            raise ValueError(f"padding_mask must be a bool tensor of input_ids' shape {tuple(input_ids.shape)} "
                             "(True = real token)")
        if not padding_mask.any(dim=1).all():
            raise ValueError("every prompt needs at least one real token (a row of padding_mask is all False)")
        if (padding_mask[:, :-1] & ~padding_mask[:, 1:]).any():
            raise ValueError("prompts must be left-padded (padding first, then the tokens): the new tokens go "
                             "in one column for every row")


def _stop_ids(stop_tokens: int | Iterable[int] | None) -> list[int]:
    if stop_tokens is None:
        return []
    if isinstance(stop_tokens, int):
        return [stop_tokens]
    return [int(t) for t in stop_tokens]


# Running the model, with or without the cache -----------------------------------------------------

class _Runner:
    """Gives the logits of the next token, for decoder-only and encoder-decoder models alike.

    With a cache, `next_logits(sequences, end)` feeds only the columns the cache has not seen yet
    (the whole prompt on the first call, then one token); without, it feeds sequences[:, :end]
    every time. Either way it returns the logits at column end - 1, [B, V], in float32.
    """

    def __init__(self, model, *, use_cache: bool, capacity: int, attention_mask: torch.Tensor | None,
                 position_ids: torch.Tensor | None, memory: torch.Tensor | None, memory_mask: torch.Tensor | None):
        self.model = model
        self.cache = model.new_cache(capacity) if use_cache else None
        self.attention_mask = attention_mask  # (B, T_total) or None: every column real
        self.position_ids = position_ids  # (B, T_total) or None: column index = position
        self.memory = memory  # (B, S, E), encoder-decoder only
        self.memory_mask = memory_mask  # (B, S)

    def next_logits(self, sequences: torch.Tensor, end: int) -> torch.Tensor:
        start = self.cache.length if self.cache is not None else 0
        ids = sequences[:, start:end]  # (B, T_new)
        mask = self.attention_mask[:, :end] if self.attention_mask is not None else None  # past + new
        if self.memory is not None:
            _, logits = self.model.decode(ids, self.memory, self.memory_mask, mask, self.cache)
        else:
            positions = self.position_ids[:, start:end] if self.position_ids is not None else None
            logits = self.model(ids, padding_mask=mask, position_ids=positions, cache=self.cache).logits
        return logits[:, -1].float()  # (B, V)

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i continues row rows[i]. Only the cache depends on the row's history;
        masks, positions and memory are the same for every beam of one prompt, and a beam's parent
        is always a beam of the same prompt."""
        if self.cache is not None:
            self.cache.reorder(rows)


def _position_ids(model, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, T_total]: each token's position counted over real tokens only (pads get 0).

    Left padding shifts a row's tokens to the right; numbering them by real tokens gives each the
    position it would have alone. ALiBi and "none" need no ids: ALiBi depends only on the
    distance between two columns, which left padding does not change (the stack measures it
    between sequence slots and ignores position ids).
    """
    if attention_mask is None or model.config.pos_encoding in ("alibi", "none"):
        return None
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


# The public function ------------------------------------------------------------------------------

def generate(
    model: nn.Module,
    input_ids: torch.Tensor | None = None,
    *,
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

    Length: prompt columns + max_new_tokens may not exceed the model's max_seq_len when its
    positions come from a table (learned, sinusoidal, rotary): a ValueError says how many new
    tokens fit. Nothing is clamped silently.

    use_cache: True (default) runs the prompt once and then one token per step through a KV cache
    of exactly prompt + max_new_tokens positions; False recomputes the whole sequence each step.
    streamer: called after every step with the list of the B tokens just chosen (greedy, sample).

    The model runs in eval mode under torch.inference_mode (its mode is restored afterwards).
    Raises ValueError for any argument outside its allowed values, naming them.
    """
    stops = _stop_ids(stop_tokens)
    if strategy is None:
        strategy = "beam" if num_beams > 1 else "greedy"
    _check_arguments(model, input_ids, padding_mask, src_ids, strategy=strategy, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams, stop_tokens=stops,
                     streamer=streamer, seed=seed, generator=generator)
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
    stack = model.decoder if encoder_decoder else model
    if stack.max_positions is not None and total > stack.max_positions:
        fit = stack.max_positions - prompt_length
        raise ValueError(
            f"{prompt_length} prompt positions + max_new_tokens={max_new_tokens} = {total} exceeds the model's "
            f"max_seq_len={stack.max_positions}; allowed: max_new_tokens <= {fit}"
            + ("" if fit >= 1 else " (the prompt alone fills the model: shorten it)")
        )

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
            attention_mask = None
            if padding_mask is not None:
                # Columns of the new tokens are real: [B, prompt] -> [B, prompt + max_new_tokens].
                attention_mask = torch.ones(batch, total, dtype=torch.bool, device=device)
                attention_mask[:, :prompt_length] = padding_mask
            positions = _position_ids(model, attention_mask)
            run = dict(model=model, use_cache=use_cache, capacity=total, attention_mask=attention_mask,
                       position_ids=positions, memory=memory, memory_mask=memory_mask)
            stop_ids = torch.tensor(stops, dtype=torch.long, device=device)
            if strategy == "beam":
                output = _beam_search(input_ids, attention_mask, run, max_new_tokens=max_new_tokens,
                                      num_beams=num_beams, length_penalty=length_penalty, stop_ids=stop_ids,
                                      pad_token_id=pad_token_id)
            else:
                choose = (lambda logits: logits.argmax(dim=-1)) if strategy == "greedy" else (
                    lambda logits: torch.multinomial(
                        sampling_distribution(logits, temperature, top_k, top_p), 1, generator=generator
                    ).squeeze(-1)
                )
                output = _one_path(input_ids, attention_mask, _Runner(**run), choose, max_new_tokens=max_new_tokens,
                                   stop_ids=stop_ids, pad_token_id=pad_token_id, streamer=streamer)
    finally:
        model.train(was_training)
    output.seed = seed
    return output


# Greedy and sampling: one path per prompt ---------------------------------------------------------

def _one_path(input_ids, attention_mask, runner: _Runner, choose, *, max_new_tokens, stop_ids, pad_token_id,
              streamer) -> GenerationOutput:
    batch, prompt_length = input_ids.shape
    sequences = input_ids.new_full((batch, prompt_length + max_new_tokens), pad_token_id)  # (B, T_total)
    sequences[:, :prompt_length] = input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
    scores = torch.zeros(batch, device=input_ids.device)
    end = prompt_length
    logits = runner.next_logits(sequences, end)  # the prefill: the whole prompt at once
    for step in range(max_new_tokens):
        token = choose(logits).masked_fill(finished, pad_token_id)  # (B,)
        log_p = torch.log_softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
        scores += log_p.masked_fill(finished, 0.0)
        sequences[:, end] = token
        end += 1
        if streamer is not None:
            streamer(token.tolist())
        if len(stop_ids):
            finished |= torch.isin(token, stop_ids)
            if bool(finished.all()):
                break
        if step + 1 < max_new_tokens:
            logits = runner.next_logits(sequences, end)  # with the cache: only the token just chosen
    sequences = sequences[:, :end]
    return GenerationOutput(sequences=sequences, padding_mask=_output_mask(sequences, attention_mask, prompt_length,
                                                                           stop_ids),
                            scores=scores, finished=finished, prompt_length=prompt_length)


def _output_mask(sequences, attention_mask, prompt_length, stop_ids) -> torch.Tensor:
    """[B, T]: the prompt's mask, then True for new tokens up to and including the first stop."""
    mask = torch.ones_like(sequences, dtype=torch.bool)
    if attention_mask is not None:
        mask[:, :prompt_length] = attention_mask[:, :prompt_length]
    if len(stop_ids):
        is_stop = torch.isin(sequences[:, prompt_length:], stop_ids).long()
        mask[:, prompt_length:] = (is_stop.cumsum(dim=1) - is_stop) == 0  # no stop strictly before
    return mask


# Beam search -------------------------------------------------------------------------------------

def _beam_search(input_ids, attention_mask, run: dict, *, max_new_tokens, num_beams, length_penalty, stop_ids,
                 pad_token_id) -> GenerationOutput:
    """Beam search with K = num_beams beams per prompt, all B*K beams in one batch.

    At each step every beam is extended by every token: K*V candidates per prompt, scored by
    the sum of log-probabilities. Of these, in order of score:
    - a candidate ending in a stop token, ranked among the best K, becomes a finished hypothesis
      with score sum / length^alpha; each prompt keeps its best K finished hypotheses;
    - the best K candidates that do not end in a stop token are the next step's beams.
    A prompt is done once it has K finished hypotheses and no live beam can still beat the worst
    of them. Log-probabilities are <= 0, so a beam's sum can only fall; the best it can reach is
    its sum now divided by the most favourable length: max_new_tokens^alpha if alpha > 0, else
    the current length^alpha. At max_new_tokens, the live beams are hypotheses too.
    """
    device = input_ids.device
    batch, prompt_length = input_ids.shape
    K, total = num_beams, prompt_length + max_new_tokens
    beams = batch * K
    # Each prompt's row is repeated K times: rows b*K .. b*K+K-1 are prompt b's beams.
    expand = lambda t: t.repeat_interleave(K, dim=0) if t is not None else None  # noqa: E731
    sequences = input_ids.new_full((beams, total), pad_token_id)  # (B*K, T_total)
    sequences[:, :prompt_length] = expand(input_ids)
    run = dict(run, attention_mask=expand(run["attention_mask"]), position_ids=expand(run["position_ids"]),
               memory=expand(run["memory"]), memory_mask=expand(run["memory_mask"]))
    runner = _Runner(**run)

    # All K beams start identical: only the first may be extended at step one, or the K beams
    # would be K copies of the same best sequence.
    beam_scores = torch.full((batch, K), -math.inf, device=device)
    beam_scores[:, 0] = 0.0
    beam_scores = beam_scores.view(beams)  # (B*K,)
    kept_sequences = sequences.new_full((batch, K, total), pad_token_id)  # finished hypotheses
    kept_scores = torch.full((batch, K), -math.inf, device=device)  # -inf = an empty slot
    kept_lengths = torch.zeros(batch, K, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    first_row = (torch.arange(batch, device=device) * K)[:, None]  # (B, 1)

    logits = runner.next_logits(sequences, prompt_length)
    vocab = logits.size(-1)
    # Enough candidates that K of them survive even if the stop tokens take the top places.
    n_candidates = min(max(2, 1 + len(stop_ids)) * K, K * vocab)
    rank = torch.arange(n_candidates, device=device)
    for step in range(max_new_tokens):
        length = step + 1  # new tokens in each candidate
        column = prompt_length + step
        log_p = torch.log_softmax(logits, dim=-1)  # (B*K, V)
        candidate = (beam_scores[:, None] + log_p).view(batch, K * vocab)  # (B, K*V)
        scores, index = torch.topk(candidate, n_candidates, dim=1)  # (B, C), best first
        parent = first_row + torch.div(index, vocab, rounding_mode="floor")  # (B, C) rows of sequences
        token = index % vocab  # (B, C)
        is_stop = torch.isin(token, stop_ids) if len(stop_ids) else torch.zeros_like(token, dtype=torch.bool)

        new_finished = is_stop & (rank < K) & ~done[:, None] & (scores > -math.inf)
        if bool(new_finished.any()):
            hyp = sequences[parent.view(-1)].view(batch, n_candidates, total)
            hyp[:, :, column] = token
            hyp_scores = torch.where(new_finished, scores / length ** length_penalty, -math.inf)
            kept_sequences, kept_scores, kept_lengths = _keep_best(
                K, (kept_sequences, hyp), (kept_scores, hyp_scores),
                (kept_lengths, torch.full_like(token, length)))

        alive_scores, pick = torch.topk(scores.masked_fill(is_stop, -math.inf), K, dim=1)  # (B, K)
        rows = parent.gather(1, pick).view(beams)
        sequences = sequences.index_select(0, rows)
        sequences[:, column] = token.gather(1, pick).view(beams)
        beam_scores = alive_scores.view(beams)
        runner.reorder(rows)

        best_length = max_new_tokens if length_penalty > 0 else length
        best_reachable = alive_scores[:, 0] / best_length ** length_penalty  # (B,)
        worst_kept = kept_scores[:, -1]
        done |= (worst_kept > -math.inf) & (worst_kept >= best_reachable)
        if bool(done.all()):
            break
        if step + 1 < max_new_tokens:
            logits = runner.next_logits(sequences, column + 1)

    if not bool(done.all()):
        # Out of length: the live beams of unfinished prompts compete with the finished ones.
        live = sequences.view(batch, K, total)
        live_scores = torch.where(done[:, None], -math.inf, alive_scores / length ** length_penalty)
        kept_sequences, kept_scores, kept_lengths = _keep_best(
            K, (kept_sequences, live), (kept_scores, live_scores),
            (kept_lengths, torch.full_like(kept_lengths, length)))

    best = kept_scores.argmax(dim=1)  # (B,)
    take = torch.arange(batch, device=device)
    lengths = kept_lengths[take, best]
    out = kept_sequences[take, best][:, :prompt_length + int(lengths.max())]  # (B, T)
    new_mask = torch.arange(out.size(1) - prompt_length, device=device)[None, :] < lengths[:, None]
    padding_mask = torch.cat([attention_mask[:, :prompt_length] if attention_mask is not None
                              else torch.ones(batch, prompt_length, dtype=torch.bool, device=device), new_mask], 1)
    last = out.gather(1, (prompt_length + lengths - 1)[:, None]).squeeze(1)
    finished = torch.isin(last, stop_ids) if len(stop_ids) else torch.zeros(batch, dtype=torch.bool, device=device)
    return GenerationOutput(sequences=out, padding_mask=padding_mask, scores=kept_scores[take, best],
                            finished=finished, prompt_length=prompt_length)


def _keep_best(k: int, sequences: tuple, scores: tuple, lengths: tuple):
    """Merge two sets of hypotheses per prompt ([B, n, T], [B, n], [B, n] each) and keep the best k."""
    all_scores = torch.cat(scores, dim=1)
    all_sequences = torch.cat(sequences, dim=1)
    all_lengths = torch.cat(lengths, dim=1)
    kept_scores, index = torch.topk(all_scores, k, dim=1)  # (B, k), best first
    kept_sequences = all_sequences.gather(1, index[:, :, None].expand(-1, -1, all_sequences.size(2)))
    return kept_sequences, kept_scores, all_lengths.gather(1, index)
