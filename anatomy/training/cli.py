"""`anatomy train lm|seq2seq|classify`: train a language model, a translator or a classifier.

    anatomy train lm --data input.txt --tokenizer char --out runs/shakespeare
    anatomy train seq2seq --src train.de --tgt train.en --test-src test.de --test-tgt test.en --out runs/de-en
    anatomy train classify --train train.tsv --val dev.tsv --init minilm --out runs/sst2

The same command under `torchrun --nproc_per_node=N` trains with DistributedDataParallel.
A run directory holds model_config.json, tokenizer.json, metrics.jsonl, loss.png, checkpoints/ and, at the
end, model/ (weights + config + tokenizer). `--resume` continues a killed run from its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch

from . import distributed
from .checkpoint import find_checkpoint, save_trained, write_text_atomically
from .data import (LMBatches, classification_data, parallel_text, split_tokens, tokenize_to_memmap)
from .schedules import SCHEDULES
from .tokenizers import KINDS, Tokenizer, train_tokenizer
from .trainer import ClassifyTask, LMTask, Seq2SeqTask, TrainConfig, Trainer

# per task: (model defaults, training defaults); every one can be overridden on the command line
DEFAULTS = {
    "lm": (dict(d_model=128, n_heads=4, n_layers=4, dropout=0.0, pos_encoding="learned"),
           dict(batch_size=12, lr=1e-3, warmup=100, max_steps=2000, schedule="cosine", tokenizer="char")),
    "seq2seq": (dict(d_model=256, n_heads=4, n_layers=3, dropout=0.1, pos_encoding="sinusoidal"),
                dict(batch_size=64, lr=1.0, warmup=1000, max_steps=5000, schedule="inverse-sqrt",
                     tokenizer="bpe", label_smoothing=0.1, betas=(0.9, 0.98))),
    "classify": (dict(d_model=128, n_heads=4, n_layers=2, dropout=0.1, pos_encoding="learned"),
                 dict(batch_size=32, lr=5e-4, warmup=100, max_steps=2000, schedule="cosine",
                      tokenizer="wordpiece")),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tasks = parser.add_subparsers(dest="task", metavar="TASK", required=True)

    lm = tasks.add_parser("lm", help="next-token language model (decoder) on a text file")
    lm.add_argument("--data", required=True, help="a UTF-8 text file")
    lm.add_argument("--val-data", help="validation text (default: the last --val-fraction of --data)")
    lm.add_argument("--val-fraction", type=float, default=0.1)
    lm.add_argument("--context", type=int, default=64, help="block size T: tokens the model sees at once")
    lm.add_argument("--eval-batches", type=int, default=50, help="validation batches per evaluation")

    s2s = tasks.add_parser("seq2seq", help="translation (encoder-decoder) on two line-aligned files")
    s2s.add_argument("--src", required=True, help="source sentences, one per line")
    s2s.add_argument("--tgt", required=True, help="target sentences, line i translating --src line i")
    s2s.add_argument("--val-src")
    s2s.add_argument("--val-tgt")
    s2s.add_argument("--test-src", help="source side of the set to score with BLEU at the end")
    s2s.add_argument("--test-tgt", help="references for --test-src")
    s2s.add_argument("--max-len", type=int, default=64, help="tokens kept per sentence (and decoded at most)")
    s2s.add_argument("--bleu-samples", type=int, default=0,
                     help="also compute BLEU on the first N test sentences at every evaluation")

    cls = tasks.add_parser("classify", help="sequence classification (encoder) on a TSV of text<TAB>label")
    cls.add_argument("--train", required=True, help="TSV: text<TAB>label (a header line is detected)")
    cls.add_argument("--val", help="TSV to report accuracy on")
    cls.add_argument("--labels", help="comma-separated allowed labels, in class order (default: those in --train)")
    cls.add_argument("--max-len", type=int, default=64, help="tokens kept per text")
    cls.add_argument("--init", help="fine-tune pretrained weights: a checkpoint path or name (e.g. minilm)")
    cls.add_argument("--pooling", choices=("first", "mean"), default="mean")

    for task, sub in (("lm", lm), ("seq2seq", s2s), ("classify", cls)):
        _common_arguments(sub, *DEFAULTS[task])


def _common_arguments(p: argparse.ArgumentParser, model_defaults: dict, train_defaults: dict) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="run directory")
    g.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --out")
    g.add_argument("--seed", type=int, default=1337)
    g.add_argument("--device", default="auto", help="auto | cpu | cuda")
    g.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--cache-dir", help="where token ids are cached (default ~/.cache/anatomy/tokens)")
    g.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")

    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer", default=train_defaults["tokenizer"],
                   help=f"{' | '.join(KINDS)} (trained on the training data), or a tokenizer.json / directory")
    g.add_argument("--vocab-size", type=int, default=8000, help="for word, bpe, wordpiece")

    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=int, default=model_defaults["d_model"])
    g.add_argument("--n-heads", type=int, default=model_defaults["n_heads"])
    g.add_argument("--n-layers", type=int, default=model_defaults["n_layers"])
    g.add_argument("--d-ff", type=int, help="feed-forward width (default 4 x d_model)")
    g.add_argument("--dropout", type=float, default=model_defaults["dropout"])
    g.add_argument("--pos-encoding", default=model_defaults["pos_encoding"])
    g.add_argument("--norm-position", default="pre", choices=("pre", "post"))
    g.add_argument("--activation", default="gelu")
    g.add_argument("--attn-impl", default="sdpa", choices=("sdpa", "eager"))

    g = p.add_argument_group("training")
    g.add_argument("--max-steps", type=int, default=train_defaults["max_steps"])
    g.add_argument("--batch-size", type=int, default=train_defaults["batch_size"], help="per rank, per micro-batch")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=train_defaults["lr"],
                   help="peak learning rate (inverse-sqrt: multiplier of the paper's formula)")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine ends at lr x this")
    g.add_argument("--schedule", choices=SCHEDULES, default=train_defaults["schedule"])
    g.add_argument("--warmup", type=int, default=train_defaults["warmup"])
    g.add_argument("--weight-decay", type=float, default=0.1)
    betas = train_defaults.get("betas", (0.9, 0.99))
    g.add_argument("--beta1", type=float, default=betas[0])
    g.add_argument("--beta2", type=float, default=betas[1])
    g.add_argument("--label-smoothing", type=float, default=train_defaults.get("label_smoothing", 0.0))
    g.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    g.add_argument("--eval-every", type=int, default=250)
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--save-every", type=int, default=500)
    g.add_argument("--keep", type=int, default=2, help="checkpoints kept on disk")


def train_config(args) -> TrainConfig:
    return TrainConfig(
        max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
        min_lr_ratio=args.min_lr_ratio, schedule=args.schedule, warmup=args.warmup,
        weight_decay=args.weight_decay, betas=(args.beta1, args.beta2), label_smoothing=args.label_smoothing,
        clip=args.clip, eval_every=args.eval_every, log_every=args.log_every, save_every=args.save_every,
        keep=args.keep, seed=args.seed, precision=args.precision, progress=not args.no_progress,
        quiet=args.quiet)


def model_config(args, **fields):
    import anatomy

    return anatomy.ModelConfig(
        d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers, d_ff=args.d_ff or 4 * args.d_model,
        dropout=args.dropout, pos_encoding=args.pos_encoding, norm_position=args.norm_position,
        activation=args.activation, attn_impl=args.attn_impl, **fields)


# ---- per task: tokenizer, data, model -----------------------------------------------------------
def _tokenizer(args, run_dir: Path, files: list[str], info) -> Tokenizer:
    """The run's tokenizer: the one saved in the run (resume), a given file, or trained on `files`
    by rank 0 and then read by every rank."""
    saved = run_dir / "tokenizer.json"
    if not saved.exists() and info.is_main:
        if args.tokenizer in KINDS:
            tok = train_tokenizer(args.tokenizer, files=files, vocab_size=args.vocab_size)
        else:
            tok = Tokenizer.load(args.tokenizer)
        tok.save(run_dir)
    distributed.barrier()
    return Tokenizer.load(saved)


# The run's model shape, fixed at its start (not config.json: the finished model/ holds that).
RUN_CONFIG = "model_config.json"


def _build_model(args, run_dir: Path, cfg):
    """A fresh model of `cfg`, or of the run's saved config when resuming (the run's shape wins)."""
    import anatomy

    saved = run_dir / RUN_CONFIG
    if saved.exists():
        cfg = anatomy.ModelConfig.from_json(saved.read_text())
    elif distributed.is_main():
        write_text_atomically(saved, cfg.to_json())
    torch.manual_seed(args.seed)  # same initial weights on every rank and every rerun
    return anatomy.build_model(cfg)


def _lm(args, run_dir, info):
    tok = _tokenizer(args, run_dir, [args.data], info)
    ids = tokenize_to_memmap(args.data, tok, args.cache_dir)
    if args.val_data:
        train_ids, val_ids = ids, tokenize_to_memmap(args.val_data, tok, args.cache_dir)
    else:
        train_ids, val_ids = split_tokens(ids, args.val_fraction)
    model = _build_model(args, run_dir, model_config(args, arch="decoder", vocab_size=tok.vocab_size,
                                                     max_seq_len=args.context))
    train = LMBatches(train_ids, args.context, args.batch_size, args.seed, info.rank, info.world_size)
    val = LMBatches(val_ids, args.context, args.batch_size, args.seed + 1)
    return model, LMTask(train, val, args.eval_batches), tok


def _seq2seq(args, run_dir, info):
    # one joint subword vocabulary for both languages, so encoder and decoder share one embedding
    tok = _tokenizer(args, run_dir, [args.src, args.tgt], info)
    if info.is_main:
        src, tgt = parallel_text(args.src, args.tgt, tok, tok, args.cache_dir)
    distributed.barrier()
    src, tgt = parallel_text(args.src, args.tgt, tok, tok, args.cache_dir)
    val = parallel_text(args.val_src, args.val_tgt, tok, tok, args.cache_dir) if args.val_src else None
    bleu_set = None
    if args.test_src:
        test_src, _ = parallel_text(args.test_src, args.test_tgt, tok, tok, args.cache_dir)
        refs = Path(args.test_tgt).read_text(encoding="utf-8").splitlines()
        bleu_set = (test_src, [r.strip() for r in refs])
    model = _build_model(args, run_dir, model_config(
        args, arch="encoder-decoder", vocab_size=tok.vocab_size, max_seq_len=args.max_len + 1,
        # the paper multiplies embeddings by sqrt(d_model) so that tokens are not drowned by the
        # unit-amplitude sinusoids; against learned positions (initialised as small as the tokens) it
        # would drown the positions instead
        scale_embeddings=args.pos_encoding == "sinusoidal", pad_token_id=tok.pad_id))
    task = Seq2SeqTask(src, tgt, tok, args.batch_size, args.max_len, args.seed, info.rank, info.world_size,
                       val=val, bleu_set=bleu_set, bleu_max=args.bleu_samples)
    return model, task, tok


def _classify(args, run_dir, info):
    labels = args.labels.split(",") if args.labels else None
    if args.init:
        model, tok = _pretrained_classifier(args, run_dir, labels)
    else:
        tok = _tokenizer(args, run_dir, [args.train], info)
        model = None
    if info.is_main:
        classification_data(args.train, tok, labels, cache_dir=args.cache_dir)
    distributed.barrier()
    seqs, y, names = classification_data(args.train, tok, labels, cache_dir=args.cache_dir)
    if info.is_main:
        write_text_atomically(run_dir / "labels.json", json.dumps(names))
    val = None
    if args.val:
        val_seqs, val_y, _ = classification_data(args.val, tok, names, cache_dir=args.cache_dir)
        val = (val_seqs, val_y)
    if model is None:
        model = _build_model(args, run_dir, model_config(
            args, arch="encoder", vocab_size=tok.vocab_size, max_seq_len=args.max_len,
            head="sequence-classification", num_labels=len(names), pooling=args.pooling, pad_token_id=tok.pad_id))
    elif model.config.num_labels != len(names):
        raise ValueError(f"--labels gives {model.config.num_labels} labels, {args.train} has {len(names)}")
    return model, ClassifyTask(seqs, y, tok, args.batch_size, args.max_len, args.seed, info.rank,
                               info.world_size, val=val), tok


def _pretrained_classifier(args, run_dir: Path, labels: list[str] | None):
    """An encoder from `anatomy.from_pretrained(args.init)` with a fresh classification head.

    Every pretrained weight must find its place (only the new head may be missing); weights the
    classifier has no use for (a masked-LM head, a pooler) are listed and dropped."""
    import anatomy

    pretrained = anatomy.from_pretrained(args.init)
    tok = anatomy.load_tokenizer(args.init)
    if labels is None:
        from .data import read_tsv

        labels = read_tsv(args.train).label_names
    cfg = pretrained.config.replace(head="sequence-classification", num_labels=len(labels), pooling=args.pooling,
                                    dropout=args.dropout)
    torch.manual_seed(args.seed)
    model = anatomy.build_model(cfg)
    missing, unexpected = model.load_state_dict(pretrained.state_dict(), strict=False)
    not_head = [k for k in missing if not k.startswith("classifier")]
    if not_head:
        raise ValueError(f"{args.init}: pretrained weights lack {not_head[:5]}")
    if unexpected:
        print(f"fine-tuning {args.init}: dropped weights the classifier does not use: {', '.join(unexpected)}")
    write_text_atomically(run_dir / RUN_CONFIG, cfg.to_json())
    tok.save(run_dir)
    return model, tok


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    info = distributed.setup(args.device)
    run_dir = Path(args.out)
    try:
        # every rank checks (reading only), so that all of them stop, not just rank 0
        if not args.resume and find_checkpoint(run_dir) is not None:
            raise ValueError(f"{run_dir} already holds checkpoints: pass --resume to continue, "
                             f"or choose another --out")
        if info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            if not args.resume:  # a fresh run forgets any half-started one in the same directory
                for stale in (RUN_CONFIG, "tokenizer.json", "metrics.jsonl"):
                    (run_dir / stale).unlink(missing_ok=True)
        distributed.barrier()
        random.seed(args.seed)
        np.random.seed(args.seed)
        model, task, tok = {"lm": _lm, "seq2seq": _seq2seq, "classify": _classify}[args.task](args, run_dir, info)
        config = train_config(args)
        if info.is_main:
            write_text_atomically(run_dir / "train_args.json", json.dumps(vars(args), default=str, indent=1))
        trainer = Trainer(model, task, config, run_dir, info, resume=args.resume, d_model=model.config.d_model)
        history = trainer.fit()
        if info.is_main:
            out = save_trained(trainer.model, tok, run_dir / "model")
            final = {k: v for r in history for k, v in r.items() if k != "step"}
            summary = ", ".join(f"{k} {final[k]:.4f}" for k in ("loss", "val_loss", "val_accuracy", "bleu")
                                if k in final)
            if not args.quiet:
                print(f"done: {summary}; model in {out}")
        return 0
    except (ValueError, FileNotFoundError) as error:
        print(f"anatomy train {args.task}: error: {error}", file=sys.stderr)
        return 2
    finally:
        distributed.cleanup()
