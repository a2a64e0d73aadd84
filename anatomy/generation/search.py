"""The searches: one path per prompt (greedy and sampling), and beam search.

Shape letters: B batch (prompts), W beams per prompt, T positions, V vocabulary.

- greedy:   x_t = argmax_x p(x | x_<t)
- sample:   x_t ~ p(x | x_<t) after temperature, top-k and top-p (nucleus) filtering
- beam:     keep the W best partial sequences by sum_t log p(x_t | x_<t), extending every one of
            them by every token at each step, and rank finished ones by
            sum_t log p(x_t | x_<t) / length^alpha (alpha = length_penalty; Wu et al., 2016 use a
            variant of the same idea).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .runner import Runner


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
    window_slid   bool    True where the sequence outgrew the model's context (max_seq_len) and the
                          later steps saw only the last max_seq_len tokens (see runner.py)
    texts         list[str] | None  each row's new tokens as text (special tokens left out), when
                          the model carries its tokenizer
    """

    sequences: torch.Tensor
    padding_mask: torch.Tensor
    scores: torch.Tensor
    finished: torch.Tensor
    prompt_length: int
    seed: int | None = None
    window_slid: bool = False
    texts: list[str] | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """[B, T - prompt_length]: only the generated columns."""
        return self.sequences[:, self.prompt_length:]


# Greedy and sampling: one path per prompt ---------------------------------------------------------

def one_path(input_ids, padding_mask, runner: Runner, choose, *, max_new_tokens, stop_ids, pad_token_id,
             streamer) -> GenerationOutput:
    """Greedy search or sampling, as `choose` (logits [B, V] -> tokens [B]) decides."""
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
    return GenerationOutput(sequences=sequences, padding_mask=_output_mask(sequences, padding_mask, prompt_length,
                                                                           stop_ids),
                            scores=scores, finished=finished, prompt_length=prompt_length, window_slid=runner.slid)


def _output_mask(sequences, padding_mask, prompt_length, stop_ids) -> torch.Tensor:
    """[B, T]: the prompt's mask, then True for new tokens up to and including the first stop."""
    mask = torch.ones_like(sequences, dtype=torch.bool)
    if padding_mask is not None:
        mask[:, :prompt_length] = padding_mask[:, :prompt_length]
    if len(stop_ids):
        is_stop = torch.isin(sequences[:, prompt_length:], stop_ids).long()
        mask[:, prompt_length:] = (is_stop.cumsum(dim=1) - is_stop) == 0  # no stop strictly before
    return mask


# Beam search -------------------------------------------------------------------------------------

def beam_search(input_ids, padding_mask, run: dict, *, max_new_tokens, num_beams, length_penalty, stop_ids,
                 pad_token_id) -> GenerationOutput:
    """Beam search with W = num_beams beams per prompt, all B*W beams in one batch.

    At each step every beam is extended by every token: W*V candidates per prompt, scored by
    the sum of log-probabilities. Of these, in order of score:
    - a candidate ending in a stop token, ranked among the best W, becomes a finished hypothesis
      with score sum / length^alpha; each prompt keeps its best W finished hypotheses;
    - the best W candidates that do not end in a stop token are the next step's beams.
    A prompt is done once it has W finished hypotheses and no live beam can still beat the worst
    of them. Log-probabilities are <= 0, so a beam's sum can only fall; the best it can reach is
    its sum now divided by the most favourable length: max_new_tokens^alpha if alpha > 0, else
    the current length^alpha. At max_new_tokens, the live beams are hypotheses too.
    """
    device = input_ids.device
    batch, prompt_length = input_ids.shape
    W, total = num_beams, prompt_length + max_new_tokens
    beams = batch * W
    # Each prompt's row is repeated W times: rows b*W .. b*W+W-1 are prompt b's beams.
    expand = lambda t: t.repeat_interleave(W, dim=0) if t is not None else None  # noqa: E731
    sequences = input_ids.new_full((beams, total), pad_token_id)  # (B*W, T_total)
    sequences[:, :prompt_length] = expand(input_ids)
    run = dict(run, padding_mask=expand(run["padding_mask"]), memory=expand(run["memory"]),
               memory_mask=expand(run["memory_mask"]))
    runner = Runner(**run)

    # All W beams start identical: only the first may be extended at step one, or the W beams
    # would be W copies of the same best sequence.
    beam_scores = torch.full((batch, W), -math.inf, device=device)
    beam_scores[:, 0] = 0.0
    beam_scores = beam_scores.view(beams)  # (B*W,)
    kept_sequences = sequences.new_full((batch, W, total), pad_token_id)  # finished hypotheses
    kept_scores = torch.full((batch, W), -math.inf, device=device)  # -inf = an empty slot
    kept_lengths = torch.zeros(batch, W, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    first_row = (torch.arange(batch, device=device) * W)[:, None]  # (B, 1)

    logits = runner.next_logits(sequences, prompt_length)
    vocab = logits.size(-1)
    # Enough candidates that W of them survive even if the stop tokens take the top places.
    n_candidates = min(max(2, 1 + len(stop_ids)) * W, W * vocab)
    rank = torch.arange(n_candidates, device=device)
    for step in range(max_new_tokens):
        length = step + 1  # new tokens in each candidate
        column = prompt_length + step
        log_p = torch.log_softmax(logits, dim=-1)  # (B*W, V)
        candidate = (beam_scores[:, None] + log_p).view(batch, W * vocab)  # (B, W*V)
        scores, index = torch.topk(candidate, n_candidates, dim=1)  # (B, C), best first
        parent = first_row + torch.div(index, vocab, rounding_mode="floor")  # (B, C) rows of sequences
        token = index % vocab  # (B, C)
        is_stop = torch.isin(token, stop_ids) if len(stop_ids) else torch.zeros_like(token, dtype=torch.bool)

        new_finished = is_stop & (rank < W) & ~done[:, None] & (scores > -math.inf)
        if bool(new_finished.any()):
            hyp = sequences[parent.view(-1)].view(batch, n_candidates, total)
            hyp[:, :, column] = token
            hyp_scores = torch.where(new_finished, scores / length ** length_penalty, -math.inf)
            kept_sequences, kept_scores, kept_lengths = _keep_best(
                W, (kept_sequences, hyp), (kept_scores, hyp_scores),
                (kept_lengths, torch.full_like(token, length)))

        alive_scores, pick = torch.topk(scores.masked_fill(is_stop, -math.inf), W, dim=1)  # (B, W)
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
        live = sequences.view(batch, W, total)
        live_scores = torch.where(done[:, None], -math.inf, alive_scores / length ** length_penalty)
        kept_sequences, kept_scores, kept_lengths = _keep_best(
            W, (kept_sequences, live), (kept_scores, live_scores),
            (kept_lengths, torch.full_like(kept_lengths, length)))

    best = kept_scores.argmax(dim=1)  # (B,)
    take = torch.arange(batch, device=device)
    lengths = kept_lengths[take, best]
    out = kept_sequences[take, best][:, :prompt_length + int(lengths.max())]  # (B, T)
    new_mask = torch.arange(out.size(1) - prompt_length, device=device)[None, :] < lengths[:, None]
    padding_mask = torch.cat([padding_mask[:, :prompt_length] if padding_mask is not None
                              else torch.ones(batch, prompt_length, dtype=torch.bool, device=device), new_mask], 1)
    last = out.gather(1, (prompt_length + lengths - 1)[:, None]).squeeze(1)
    finished = torch.isin(last, stop_ids) if len(stop_ids) else torch.zeros(batch, dtype=torch.bool, device=device)
    return GenerationOutput(sequences=out, padding_mask=padding_mask, scores=kept_scores[take, best],
                            finished=finished, prompt_length=prompt_length, window_slid=runner.slid)


def _keep_best(k: int, sequences: tuple, scores: tuple, lengths: tuple):
    """Merge two sets of hypotheses per prompt ([B, n, T], [B, n], [B, n] each) and keep the best k."""
    all_scores = torch.cat(scores, dim=1)
    all_sequences = torch.cat(sequences, dim=1)
    all_lengths = torch.cat(lengths, dim=1)
    kept_scores, index = torch.topk(all_scores, k, dim=1)  # (B, k), best first
    kept_sequences = all_sequences.gather(1, index[:, :, None].expand(-1, -1, all_sequences.size(2)))
    return kept_sequences, kept_scores, all_lengths.gather(1, index)
