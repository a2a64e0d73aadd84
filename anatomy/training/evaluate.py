"""Greedy translation and corpus BLEU for a trained encoder-decoder.

Greedy decoding is anatomy.generate's: encode the source once; then, starting from <SOS>, feed the
decoder one token at a time (its keys and values kept in a KV cache) and take the most probable
next token, until every sentence has produced <EOS> or `max_len` tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from ..generation import generate
from ..inputs import pad_batch


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
        src_ids, src_mask = pad_batch([s[:max_len] for s in (sources[i] for i in idx)], tokenizer.pad_id)
        src_ids, src_mask = src_ids.to(device), src_mask.to(device)  # (B, S)
        generated = generate(
            model, src_ids=src_ids, src_padding_mask=src_mask, max_new_tokens=max_len, strategy="greedy",
            decoder_start_token_id=tokenizer.bos_id, stop_tokens=tokenizer.eos_id, pad_token_id=tokenizer.pad_id,
        ).new_tokens.tolist()  # (B, <= max_len): finished rows end in <EOS>, then padding
        for row, i in zip(generated, idx):
            out[i] = row[:row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row
    return out


def bleu(model, tokenizer, sources: list[np.ndarray], references: list[str], max_len: int, device="cpu") -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenization, detokenized text) of greedy translations."""
    import sacrebleu

    hypotheses = [tokenizer.decode(ids) for ids in greedy_translate(model, tokenizer, sources, max_len, device)]
    return sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
