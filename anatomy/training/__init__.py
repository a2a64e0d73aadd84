"""Training: tokenizers, data, the trainer, checkpoints and distributed data parallel.

    tokenizers.py   char / word / BPE / WordPiece, one interface, saved as tokenizer.json
    data.py         files -> memory-mapped token ids -> batches (lm, seq2seq, classify)
    schedules.py    learning-rate schedules (warmup + cosine; the paper's inverse square root)
    checkpoint.py   atomic checkpoints: weights, optimizer, scheduler, RNG states, step;
                    save_trained / load_trained for the finished model
    distributed.py  DistributedDataParallel setup (gloo on CPU, NCCL on GPU)
    trainer.py      the training loop and the three tasks (lm, seq2seq, classify)
    evaluate.py     greedy translation (KV cache) and sacrebleu BLEU
    cli.py          `anatomy train lm|seq2seq|classify`
"""

from .tokenizers import Tokenizer, load_tokenizer, train_tokenizer

__all__ = ["Tokenizer", "load_tokenizer", "train_tokenizer"]
