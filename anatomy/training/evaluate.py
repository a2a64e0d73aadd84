"""Greedy translation and corpus BLEU for a trained encoder-decoder.

Greedy decoding: encode the source once; then, starting from <SOS>, feed the decoder one token at a
time (its keys and values kept in a KV cache) and take the most probable next token, until every
sentence has produced <EOS> or `max_len` tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from .data import pad


@torch.no_grad()
def greedy_translate(model, tokenizer, sources: list[np.ndarray], max_len: int, device="cpu",
                     batch_size: int = 128) -> list[list[int]]:
    """Source id sequences -> generated target ids (without <SOS>/<EOS>), in the input order.

    Sentences are decoded in batches sorted by length, so little of each batch is padding."""
    model.eval()
    order = np.argsort([len(s) for s in sources], kind="stable")
    out: list[list[int]] = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src_ids, src_mask = pad([s[:max_len] for s in (sources[i] for i in idx)], tokenizer.pad_id)
        src_ids, src_mask = src_ids.to(device), src_mask.to(device)  # (B, S)
        memory = model.encode(src_ids, src_mask)  # (B, S, E)
        cache = model.new_cache(capacity=max_len + 1)
        token = torch.full((len(idx), 1), tokenizer.bos_id, dtype=torch.long, device=device)  # (B, 1)
        done = torch.zeros(len(idx), dtype=torch.bool, device=device)
        steps = []
        for _ in range(max_len):
            _, logits = model.decode(token, memory, src_padding_mask=src_mask, cache=cache)  # (B, 1, V)
            token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            steps.append(token)
            done |= token[:, 0] == tokenizer.eos_id
            if done.all():
                break
        generated = torch.cat(steps, dim=1).tolist()  # (B, <= max_len)
        for row, i in zip(generated, idx):
            out[i] = row[:row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row
    return out


def bleu(model, tokenizer, sources: list[np.ndarray], references: list[str], max_len: int, device="cpu") -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenization, detokenized text) of greedy translations."""
    import sacrebleu

    hypotheses = [tokenizer.decode(ids) for ids in greedy_translate(model, tokenizer, sources, max_len, device)]
    return sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
