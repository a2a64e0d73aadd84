"""Training: tokenizers, data, tasks, the trainer, checkpoints, the run folder and distributed data parallel.

    tokenizers.py   char / word / BPE / WordPiece trainers, returning anatomy's one Tokenizer
    data.py         files -> memory-mapped token ids -> batches (lm, seq2seq, classify)
    tasks.py        what a batch is and what the loss is, per task (lm and seq2seq: the model's chunked loss)
    schedules.py    learning-rate schedules (warmup + cosine; the paper's inverse square root)
    trainer.py      the training loop and its optimizer (fused AdamW)
    optimizers.py   the optimizers' parameter groups, layer-wise LR decay, AdamW + Muon as one
    muon.py         Muon: momentum orthogonalised by Newton-Schulz / Polar Express iterations, shapes stacked
    ema.py          the weights' exponential moving average (--ema), a final model like averaging.py's
    metrics.py      metrics.jsonl, loss.png, the progress bar
    checkpoint.py   atomic checkpoints: weights, optimizer, scheduler, RNG states, step; fallback past
                    damaged ones; save_trained / load_trained for the finished model
    rundir.py       the run folder's exclusive lock: one writer at a time
    distributed.py  DistributedDataParallel setup (gloo on CPU, NCCL on GPU)
    evaluate.py     greedy translation (KV cache) and sacrebleu BLEU
    build.py        a run's tokenizer, data, task and model from the command-line arguments
    cli.py          `anatomy train lm|seq2seq|classify`
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    **{name: ".tokenizers" for name in ("Tokenizer", "load_tokenizer", "train_tokenizer")},
    "LMBatches": ".data",
    **{name: ".tasks" for name in ("ClassifyTask", "LMTask", "Seq2SeqTask")},
    "TrainConfig": ".trainer", "Trainer": ".trainer",
    "load_trained": ".checkpoint", "save_trained": ".checkpoint",
})
