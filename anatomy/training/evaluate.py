"""Translation and corpus BLEU for a trained encoder-decoder: greedy or beam search.

Decoding is anatomy.generate's: encode the source once; then, starting from <SOS>, feed the decoder
one token at a time (its keys and values kept in a KV cache), until every sentence has produced
<EOS> or `max_len` tokens. With beams = 1 each step takes the most probable next token (greedy);
with beams = W > 1, beam search keeps the W best partial translations and returns the finished one
with the highest

    sum_t log p(y_t | y_<t, x) / |y|^length_penalty

(generation/search.py). Without the division a beam prefers short translations, since every token
lowers the sum; length_penalty 1 ranks by the mean log-probability per token, 0 by the plain sum.
"""

from __future__ import annotations

import numpy as np
import torch

from ..generation import generate
from ..inputs import pad_batch


@torch.no_grad()
def translate(model, tokenizer, sources: list[np.ndarray], max_len: int, device="cpu", batch_size: int = 128,
              beams: int = 1, length_penalty: float = 1.0) -> list[list[int]]:
    """Source id sequences -> generated target ids (without <SOS>/<EOS>), in the input order.

    Sentences are decoded in batches sorted by length, so little of each batch is padding; a batch
    of beam search holds batch_size / beams sentences, so that its rows stay batch_size."""
    model.eval()
    order = np.argsort([len(s) for s in sources], kind="stable")
    per_batch = max(1, batch_size // beams)
    out: list[list[int]] = [None] * len(sources)
    for start in range(0, len(order), per_batch):
        idx = order[start:start + per_batch]
        src_ids, src_mask = pad_batch([s[:max_len] for s in (sources[i] for i in idx)], tokenizer.pad_id)
        src_ids, src_mask = src_ids.to(device), src_mask.to(device)  # (B, S)
        generated = generate(
            model, src_ids=src_ids, src_padding_mask=src_mask, max_new_tokens=max_len,
            strategy="beam" if beams > 1 else "greedy", num_beams=beams, length_penalty=length_penalty,
            decoder_start_token_id=tokenizer.bos_id, stop_tokens=tokenizer.eos_id, pad_token_id=tokenizer.pad_id,
        ).new_tokens.tolist()  # (B, <= max_len): finished rows end in <EOS>, then padding
        for row, i in zip(generated, idx):
            out[i] = row[:row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row
    return out


def bleu(model, tokenizer, sources: list[np.ndarray], references: list[str], max_len: int, device="cpu",
         beams: int = 1, length_penalty: float = 1.0) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenization, detokenized text) of `translate`'s output."""
    import sacrebleu

    hypotheses = [tokenizer.decode(ids) for ids in translate(model, tokenizer, sources, max_len, device,
                                                             beams=beams, length_penalty=length_penalty)]
    return sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
