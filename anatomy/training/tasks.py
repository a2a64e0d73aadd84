"""The three tasks: what a batch is, what the loss is, and what an evaluation reports.

Shapes: B batch, T target length, S source length, V vocabulary, C classes.

Each task's `loss(model, batch, label_smoothing)` is the *sum* of the per-prediction losses of
the batch; the trainer divides by the count of the whole global batch (see trainer.py).
Language modelling and translation call the model's own loss (DecoderModel.loss,
EncoderDecoderModel.loss): the chunked LM head + cross-entropy of anatomy/losses.py, the one LM
loss that `anatomy bench --only train` measures. It never holds the [B, T, V] logits.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .data import IGNORE_INDEX, EpochBatches, LMBatches, TokenSequences, classify_batch, drop_tokens, seq2seq_batch
from .ensemble import ensemble_metrics
from .evaluate import bleu


def count_targets(batch: dict) -> int:
    """How many positions the loss sums over (tokens for lm/seq2seq, examples for classify)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class LMTask:
    """Next-token prediction on random blocks of a token stream (decoder)."""

    name = "lm"

    def __init__(self, train: LMBatches, val: LMBatches | None = None, eval_batches: int = 20):
        self.train, self.val, self.eval_batches = train, val, eval_batches

    def batch(self, k: int) -> dict:
        return self.train.batch(k)

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        return model.loss(batch["input_ids"], targets=batch["labels"], ignore_index=IGNORE_INDEX,
                          label_smoothing=label_smoothing, reduction="sum")

    def sizes(self) -> dict:
        """Tokens in the training and validation data, tokens per micro-batch and its shape (for the summary)."""
        b, t = self.train.batch_size, self.train.block_size
        return {"train": len(self.train.ids), "validation": len(self.val.ids) if self.val else 0,
                "per_batch": b * t, "batch": f"{b} x {t} tokens"}

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        if self.val is None:
            return {}
        total, count = 0.0, 0
        for batch in self.val.eval_batches(self.eval_batches):
            batch = to_device(batch, device)
            total += self.loss(model, batch).item()
            count += count_targets(batch)
        return {"val_loss": total / count}


class Seq2SeqTask:
    """Translation with teacher forcing (encoder-decoder); BLEU when a test set is given, decoded
    greedily (beams 1) or by beam search ranked with `length_penalty` (evaluate.py)."""

    name = "seq2seq"

    def __init__(self, src: TokenSequences, tgt: TokenSequences, tokenizer, batch_size: int, max_len: int,
                 seed: int, rank: int = 0, world_size: int = 1, val: tuple | None = None,
                 bleu_set: tuple | None = None, bleu_max: int | None = None, beams: int = 1,
                 length_penalty: float = 1.0):
        self.src, self.tgt, self.tok, self.max_len = src, tgt, tokenizer, max_len
        lengths = np.maximum(src.lengths(), tgt.lengths())
        self.sampler = EpochBatches(lengths, batch_size, seed, rank, world_size, bucket=50)
        self.batch_size, self.val, self.bleu_set, self.bleu_max = batch_size, val, bleu_set, bleu_max
        self.beams, self.length_penalty = beams, length_penalty

    def _collate(self, src, tgt, idx) -> dict:
        t = self.tok
        return seq2seq_batch([src[i] for i in idx], [tgt[i] for i in idx], t.pad_id, t.bos_id, t.eos_id,
                             self.max_len, self.max_len)

    def batch(self, k: int) -> dict:
        return self._collate(self.src, self.tgt, self.sampler.indices(k))

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        return model.loss(batch["src_ids"], batch["tgt_ids"], batch["labels"], src_padding_mask=batch["src_padding_mask"],
                          tgt_padding_mask=batch["tgt_padding_mask"], ignore_index=IGNORE_INDEX,
                          label_smoothing=label_smoothing, reduction="sum")

    def sizes(self) -> dict:
        val = self.val[0].lengths().sum() + self.val[1].lengths().sum() if self.val else 0
        return {"train": int(self.src.lengths().sum() + self.tgt.lengths().sum()), "validation": int(val),
                "per_batch": 2 * self.batch_size * self.max_len, "per_batch_is_at_most": True,
                "batch": f"{self.batch_size} pairs x up to {self.max_len} + {self.max_len} tokens"}

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        metrics = {}
        if self.val is not None:
            src, tgt = self.val
            total, count = 0.0, 0
            for start in range(0, len(src), 2 * self.batch_size):
                batch = to_device(self._collate(src, tgt, range(start, min(len(src), start + 2 * self.batch_size))),
                                  device)
                total += self.loss(model, batch).item()
                count += count_targets(batch)
            metrics["val_loss"] = total / count
        if self.bleu_set is not None and (final or self.bleu_max):
            src, refs = self.bleu_set
            n = len(src) if final or not self.bleu_max else min(self.bleu_max, len(src))
            metrics["bleu" if n == len(src) else f"bleu_first{n}"] = bleu(
                model, self.tok, [src[i] for i in range(n)], refs[:n], self.max_len, device, beams=self.beams,
                length_penalty=self.length_penalty)
        return metrics


class ClassifyTask:
    """Sequence classification (encoder with a classification head): one label per text.

    With `token_dropout` > 0 each training text loses each token with that probability
    (data.drop_tokens), drawn from (seed, micro-batch k, rank): a pure function of k, as the batch is."""

    name = "classify"

    def __init__(self, seqs: TokenSequences, labels: np.ndarray, tokenizer, batch_size: int, max_len: int,
                 seed: int, rank: int = 0, world_size: int = 1, val: tuple | None = None,
                 token_dropout: float = 0.0, members: list[tuple] = ()):
        self.seqs, self.labels, self.tok, self.max_len = seqs, labels, tokenizer, max_len
        self.sampler = EpochBatches(np.minimum(seqs.lengths(), max_len), batch_size, seed, rank, world_size,
                                    bucket=50)
        self.batch_size, self.val = batch_size, val
        self.seed, self.rank, self.token_dropout = seed, rank, token_dropout
        self.members = list(members)  # (model, tokenizer, val sequences) of trained runs: ensemble.py

    def _collate(self, seqs, labels, idx, dropout_rng: np.random.Generator | None = None, tokenizer=None) -> dict:
        t = tokenizer or self.tok
        idx = list(idx)
        texts = [seqs[i] for i in idx]
        if dropout_rng is not None:
            texts = drop_tokens(texts, self.token_dropout, dropout_rng)
        return classify_batch(texts, labels[idx], t.pad_id, t.bos_id, t.eos_id, self.max_len)

    def batch(self, k: int) -> dict:
        rng = np.random.default_rng([self.seed, k, self.rank]) if self.token_dropout else None
        return self._collate(self.seqs, self.labels, self.sampler.indices(k), rng)

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        logits = model(batch["input_ids"], padding_mask=batch["padding_mask"]).logits  # (B, C)
        return F.cross_entropy(logits.float(), batch["labels"], label_smoothing=label_smoothing, reduction="sum")

    def sizes(self) -> dict:
        return {"train": int(np.minimum(self.seqs.lengths(), self.max_len).sum()),
                "validation": int(np.minimum(self.val[0].lengths(), self.max_len).sum()) if self.val else 0,
                "per_batch": self.batch_size * self.max_len, "per_batch_is_at_most": True,
                "batch": f"{self.batch_size} texts x up to {self.max_len} tokens"}

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        if self.val is None:
            return {}
        seqs, labels = self.val
        logits = self._logits(model, device, seqs, self.tok)  # (N, C)
        target = torch.as_tensor(labels, device=logits.device)
        metrics = {"val_loss": F.cross_entropy(logits, target).item(),
                   "val_accuracy": (logits.argmax(-1) == target).float().mean().item()}
        if final and self.members:  # the mean of this model's and each member's class probabilities
            probabilities = [logits.softmax(-1)] + [
                self._logits(member.to(device), device, member_seqs, member_tok).softmax(-1).to(logits.device)
                for member, member_tok, member_seqs in self.members]
            metrics.update(ensemble_metrics(probabilities, target))
        return metrics

    def _logits(self, model, device, seqs: TokenSequences, tokenizer) -> torch.Tensor:
        """(N, C) float32 logits of every validation text, as `tokenizer` (a member's own) reads it."""
        labels = self.val[1]
        out = []
        for start in range(0, len(seqs), 2 * self.batch_size):
            rows = range(start, min(len(seqs), start + 2 * self.batch_size))
            batch = to_device(self._collate(seqs, labels, rows, tokenizer=tokenizer), device)
            out.append(model(batch["input_ids"], padding_mask=batch["padding_mask"]).logits.float())  # (B, C)
        return torch.cat(out)  # (N, C)
