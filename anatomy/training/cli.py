"""`anatomy train lm|seq2seq|classify`: train a language model, a translator or a classifier.

    anatomy train lm --data input.txt --tokenizer char --out runs/shakespeare
    anatomy train seq2seq --src train.de --tgt train.en --test-src test.de --test-tgt test.en --out runs/de-en
    anatomy train classify --train train.tsv --val dev.tsv --init minilm --out runs/sst2

The same command under `torchrun --nproc_per_node=N` trains with DistributedDataParallel.
A run directory holds model_config.json, tokenizer.json, train_args.json, metrics.jsonl, loss.png,
checkpoints/ and, at the end, model/ (weights + config + tokenizer). `--resume` continues a killed
run from its last good checkpoint. One run at a time writes to a run directory (rundir.py).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from ..arguments import (add_compute_arguments, add_model_argument, finite_float, fraction, fraction_or_one, input_file,
                         non_negative_float, non_negative_int, output_folder, positive_float, positive_int, probability,
                         seed, text)
from ..parser import closest
from ..terminal import one_line, printable, summary_block
from ..config import ACTIVATIONS, ATTN_IMPLS, NORM_POSITIONS, NORMS, POS_ENCODINGS, QK_NORMS
from ..generation.choices import MAX_LENGTH_PENALTY
from .choices import KINDS, NS_NORMS, NS_SCHEDULES, OPTIMIZERS
from .schedules import SCHEDULES

# The data, the model, the trainer and torch are imported by the functions that use them, once the
# arguments have been checked (anatomy.lazy): a mistake is refused in milliseconds.

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


MAX_VOCAB = 2**20  # a tokenizer trained here: more entries than this is no vocabulary a model can use on one machine


def vocab_size(value: str) -> int:
    """An argparse type: a vocabulary size, 2 to MAX_VOCAB."""
    size = positive_int(value)
    if not 2 <= size <= MAX_VOCAB:
        raise argparse.ArgumentTypeError(f"{size} is not a vocabulary size (2 to {MAX_VOCAB:,})")
    return size


MAX_LAYERS = 1000  # deeper than any Transformer trained so far; building a model is a loop over its blocks


def layer_count(value: str) -> int:
    """An argparse type: a number of blocks, 1 to MAX_LAYERS."""
    count = positive_int(value)
    if count > MAX_LAYERS:
        raise argparse.ArgumentTypeError(f"{count:,} layers is more than {MAX_LAYERS:,}")
    return count


def label_list(value: str) -> str:
    """An argparse type: comma-separated class labels, at least two, none empty, none repeated."""
    labels = value.split(",")
    if any(not label.strip() for label in labels):
        raise argparse.ArgumentTypeError(f"{one_line(value, 100)!r} has an empty label (labels are separated by commas)")
    value = text(value)
    if len(set(labels)) != len(labels):
        raise argparse.ArgumentTypeError(f"{one_line(value, 100)!r} names a label twice")
    if len(labels) < 2:
        raise argparse.ArgumentTypeError(f"{one_line(value, 100)!r}: a classifier needs at least two labels")
    return value


def tokenizer_choice(value: str) -> str:
    """An argparse type: a kind of tokenizer to train (KINDS), or a tokenizer.json or folder that exists."""
    if value in KINDS:
        return value
    if not value.strip():
        raise argparse.ArgumentTypeError(f"an empty name; give {', '.join(KINDS)}, or a tokenizer.json or its folder")
    try:
        exists = Path(value).expanduser().exists()
    except (OSError, ValueError):
        exists = False
    if not exists:
        meant = closest(value, KINDS)
        raise argparse.ArgumentTypeError(f"{one_line(value, 100)!r} is no tokenizer kind ({', '.join(KINDS)}) and "
                                         "no tokenizer.json or folder that exists"
                                         + (f"; did you mean {meant!r}?" if meant else ""))
    return value


MAX_BEAMS = 64  # BLEU's beam search decodes 128 / beams sentences at a time: more beams is one sentence a batch


def ema_decay(text: str) -> float:
    """An EMA decay: 0 (none) or strictly between 0 and 1."""
    value = probability(text)
    if value == 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a decay of 1 never moves the average (0: no average, or below 1)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tasks = parser.add_subparsers(dest="task", metavar="TASK", required=True)

    lm = tasks.add_parser("lm", help="next-token language model (decoder) on a text file")
    lm.add_argument("--data", required=True, type=input_file, help="a UTF-8 text file")
    lm.add_argument("--val-data", type=input_file, help="validation text (default: the last --val-fraction of --data)")
    lm.add_argument("--val-fraction", type=fraction, default=0.1, help="share of --data kept for validation")
    lm.add_argument("--context", type=positive_int, default=64, help="block size T: tokens the model sees at once")
    lm.add_argument("--eval-batches", type=positive_int, default=50, help="validation batches per evaluation")

    s2s = tasks.add_parser("seq2seq", help="translation (encoder-decoder) on two line-aligned files")
    s2s.add_argument("--src", required=True, type=input_file, help="source sentences, one per line")
    s2s.add_argument("--tgt", required=True, type=input_file, help="target sentences, line i translating --src line i")
    s2s.add_argument("--val-src", type=input_file, help="validation source sentences (with --val-tgt)")
    s2s.add_argument("--val-tgt", type=input_file, help="validation target sentences (with --val-src)")
    s2s.add_argument("--test-src", type=input_file, help="source side of the set to score with BLEU at the end "
                     "(with --test-tgt)")
    s2s.add_argument("--test-tgt", type=input_file, help="references for --test-src")
    s2s.add_argument("--max-len", type=positive_int, default=64, help="tokens kept per sentence (and decoded at most)")
    s2s.add_argument("--bleu-samples", type=non_negative_int, default=0,
                     help="also compute BLEU on the first N test sentences at every evaluation")
    s2s.add_argument("--beams", type=positive_int, default=1,
                     help=f"BLEU's decoding: 1 greedy, more: beam search with this many beams (at most {MAX_BEAMS})")
    s2s.add_argument("--length-penalty", type=finite_float, default=1.0,
                     help="beam search ranks finished translations by log p / length^this "
                          f"(-{MAX_LENGTH_PENALTY} to {MAX_LENGTH_PENALTY})")

    cls = tasks.add_parser("classify", help="sequence classification (encoder) on a TSV of text<TAB>label")
    cls.add_argument("--train", required=True, type=input_file, help="TSV: text<TAB>label (a header line is detected)")
    cls.add_argument("--val", type=input_file, help="TSV to report accuracy on")
    cls.add_argument("--labels", type=label_list,
                     help="comma-separated allowed labels, in class order (default: those in --train)")
    cls.add_argument("--max-len", type=positive_int, default=64, help="tokens kept per text")
    add_model_argument(cls, default=None, flag="--init", help="fine-tune this pretrained encoder")
    cls.add_argument("--pooling", choices=("first", "mean"), default="mean",
                     help="the sequence's vector: its first token's, or the mean of its tokens'")
    cls.add_argument("--token-dropout", type=probability, default=0.0,
                     help="word dropout: each training text loses each token with this probability (0: none)")
    cls.add_argument("--ensemble-with", nargs="+", metavar="RUN",
                     help="finished classify runs: the final evaluation also scores the mean of their and this "
                          "model's class probabilities on --val (ensemble_accuracy)")

    for task, sub in (("lm", lm), ("seq2seq", s2s), ("classify", cls)):
        _common_arguments(sub, *DEFAULTS[task])


def _common_arguments(p: argparse.ArgumentParser, model_defaults: dict, train_defaults: dict) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, type=output_folder, help="run directory")
    g.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --out")
    g.add_argument("--seed", type=seed, default=1337, help="seed of the weights, the data order and dropout")
    add_compute_arguments(g)
    g.add_argument("--cache-dir", type=output_folder,
                   help="where token ids are cached (default: ~/.cache/anatomy/tokens)")
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")

    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer", default=train_defaults["tokenizer"], type=tokenizer_choice,
                   help=f"{' | '.join(KINDS)} (trained on the training data), or a tokenizer.json / directory")
    g.add_argument("--vocab-size", type=vocab_size, help="for word, bpe, wordpiece (default: 8000)")

    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, default=model_defaults["d_model"], help="width of the residual stream")
    g.add_argument("--n-heads", type=positive_int, default=model_defaults["n_heads"],
                   help="attention heads (must divide --d-model)")
    g.add_argument("--n-layers", type=layer_count, default=model_defaults["n_layers"], help="blocks (per stack)")
    g.add_argument("--d-ff", type=positive_int, help="feed-forward width (default: 4 x d_model)")
    g.add_argument("--dropout", type=probability, default=model_defaults["dropout"], help="dropout probability")
    g.add_argument("--pos-encoding", default=model_defaults["pos_encoding"], choices=POS_ENCODINGS, metavar="KIND",
                   help=f"how positions enter the model: {', '.join(POS_ENCODINGS)}")
    g.add_argument("--norm", default="layernorm", choices=NORMS, help="the normalisation")
    g.add_argument("--norm-position", default="pre", choices=NORM_POSITIONS, metavar="WHERE",
                   help="pre: x + f(Norm(x)) (GPT-2), post: Norm(x + f(x)) (the paper), sandwich: x + Norm(f(Norm(x))) "
                        "(Gemma 2), post_sublayer: x + Norm(f(x)) (OLMo 2)")
    g.add_argument("--activation", default="gelu", choices=ACTIVATIONS, metavar="NAME",
                   help=f"{', '.join(ACTIVATIONS)}; gated ones (swiglu, geglu) have 3 matrices: d_ff 2/3 as wide keeps "
                        "the parameters")
    g.add_argument("--qk-norm", default="none", choices=QK_NORMS, help="RMSNorm on queries and keys")
    g.add_argument("--no-bias", dest="bias", action="store_false", help="no biases in attention and feed-forward")
    g.add_argument("--untied", action="store_true", help="an output matrix of its own, not the token embeddings")
    g.add_argument("--attn-impl", default="sdpa", choices=ATTN_IMPLS, help="the attention kernel")

    g = p.add_argument_group("training")
    g.add_argument("--max-steps", type=positive_int, default=train_defaults["max_steps"], help="optimizer steps")
    g.add_argument("--batch-size", type=positive_int, default=train_defaults["batch_size"],
                   help="per rank, per micro-batch")
    g.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=positive_float, default=train_defaults["lr"],
                   help="peak learning rate (inverse-sqrt: multiplier of the paper's formula)")
    g.add_argument("--min-lr-ratio", type=probability, default=0.1, help="cosine, linear and wsd end at lr x this")
    g.add_argument("--schedule", choices=SCHEDULES, default=train_defaults["schedule"], help="learning-rate schedule")
    g.add_argument("--warmup", type=non_negative_int, default=train_defaults["warmup"],
                   help="steps of linear warm-up")
    g.add_argument("--decay-fraction", type=fraction_or_one, default=0.2,
                   help="wsd: the share of --max-steps at the end spent decaying to --min-lr-ratio")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                   help="adamw, or muon for the blocks' weight matrices (AdamW for the rest)")
    g.add_argument("--ns-coefficients", choices=NS_SCHEDULES, default="jordan",
                   help="muon: Newton-Schulz coefficients, Jordan's fixed quintic or Polar Express's per iteration")
    g.add_argument("--ns-steps", type=positive_int, default=5, help="muon: Newton-Schulz iterations per step")
    g.add_argument("--ns-norm", choices=NS_NORMS, default="frobenius",
                   help="muon: scale the momentum by its Frobenius norm, or by ||(M M^T)^2||_F^(1/4), nearly its "
                        "largest singular value")
    g.add_argument("--layer-decay", type=fraction_or_one, default=1.0,
                   help="layer-wise LR decay: each block learns at this x the rate of the one above it (1: none)")
    g.add_argument("--head-lr-scale", type=positive_float, default=1.0,
                   help="the head and final norm (above the blocks) learn at --lr x this (1: like the body)")
    g.add_argument("--weight-decay", type=non_negative_float, default=0.1, help="AdamW's decoupled weight decay")
    betas = train_defaults.get("betas", (0.9, 0.99))
    g.add_argument("--beta1", type=fraction, default=betas[0], help="AdamW's first-moment decay")
    g.add_argument("--beta2", type=fraction, default=betas[1], help="AdamW's second-moment decay")
    g.add_argument("--label-smoothing", type=probability, default=train_defaults.get("label_smoothing", 0.0),
                   help="share of the target's probability spread over the vocabulary")
    g.add_argument("--clip", type=non_negative_float, default=1.0, help="max gradient norm (0: no clipping)")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="auto: bf16 autocast on a GPU that has it, else fp32")
    g.add_argument("--eval-every", type=non_negative_int, default=250, help="steps (0: only at the end)")
    g.add_argument("--log-every", type=positive_int, default=10, help="steps between log lines")
    g.add_argument("--save-every", type=non_negative_int, default=500, help="steps (0: only at the end)")
    g.add_argument("--keep", type=positive_int, default=2, help="checkpoints kept on disk")
    g.add_argument("--average-last", type=positive_int, default=1,
                   help="the final model: the mean of the last N checkpoints' weights (needs --keep N or more)")
    g.add_argument("--ema", type=ema_decay, default=0.0,
                   help="the final model: the weights' exponential moving average over every step with this decay, "
                        "e.g. 0.999 (about the last 1/(1-decay) steps; 0: none)")


def train_config(args):
    """The TrainConfig the arguments ask for."""
    from .trainer import TrainConfig

    return TrainConfig(
        max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
        min_lr_ratio=args.min_lr_ratio, schedule=args.schedule, warmup=args.warmup,
        decay_fraction=args.decay_fraction, optimizer=args.optimizer, layer_decay=args.layer_decay,
        head_lr_scale=args.head_lr_scale,
        ns_coefficients=args.ns_coefficients, ns_steps=args.ns_steps, ns_norm=args.ns_norm,
        weight_decay=args.weight_decay, average_last=args.average_last, ema=args.ema, betas=(args.beta1, args.beta2),
        label_smoothing=args.label_smoothing, clip=args.clip, eval_every=args.eval_every, log_every=args.log_every, save_every=args.save_every,
        keep=args.keep, seed=args.seed, precision=args.precision, progress=not args.no_progress,
        quiet=args.quiet)


def plain_arguments(args, tokenizer) -> dict:
    """The command line as plain JSON values (no functions, no paths objects), with the vocabulary
    size the run really has (a char tokenizer's is the characters seen, whatever --vocab-size said)."""
    plain = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    plain["vocab_size"] = tokenizer.vocab_size
    return json.loads(json.dumps(plain))  # fails loudly on anything that is not plain JSON


def summary(args, model, task, tokenizer, info) -> str:
    """The start-up summary: model, device, data and budget, as a newcomer wants to see them first."""
    import torch

    params = sum(p.numel() for p in model.parameters())
    sizes = task.sizes()
    per_step = sizes["per_batch"] * args.grad_accum * info.world_size
    at_most = "up to " if sizes.get("per_batch_is_at_most") else ""
    rows = [
        ("model", f"{params / 1e6:.2f} M parameters ({model.config.arch}, {model.config.n_layers} layers, "
                  f"d_model {model.config.d_model})"),
        ("device", f"{info.device}, {torch.get_num_threads()} thread(s), {info.world_size} rank(s)"),
        ("vocabulary", f"{tokenizer.vocab_size:,} tokens ({tokenizer.kind})"),
        ("data", f"{sizes['train']:,} tokens train, {sizes['validation']:,} validation"),
        ("steps", f"{args.max_steps:,} x {at_most}{per_step:,} tokens per step ({sizes['batch']} x {args.grad_accum} "
                  f"micro-batch(es) x {info.world_size} rank(s)) = {at_most}{per_step * args.max_steps:,} tokens"),
    ]
    return summary_block(f"anatomy train {args.task} -> {printable(args.out)}", rows)


def _lock(run_dir: Path, info):
    """The run folder's RunLock (None on ranks but 0): rank 0 locks it, and every rank learns whether
    it could, so that all stop together."""
    import torch

    from . import distributed
    from .rundir import RunLock

    lock, error = None, None
    if info.is_main:
        try:
            lock = RunLock(run_dir).acquire()
        except ValueError as refused:
            error = refused
    held = distributed.all_reduce_sum(torch.tensor(0.0 if error else 1.0, device=info.device)).item()
    if error is not None:
        raise error
    if held < info.world_size:
        raise ValueError(f"{run_dir} is in use by another run")
    return lock


def check_arguments(args) -> None:
    """What can be checked before the run folder is touched or a file read: options that go in
    pairs, the --init encoder, and the memory one training step will need (budget.py)."""
    from ..checkpoints.describe import config_of
    from .budget import check_training_memory
    from .build import planned_config
    from .ensemble import check_member_runs

    if args.average_last > 1 and (args.keep < args.average_last or not args.save_every):
        raise ValueError(f"--average-last {args.average_last} averages the last {args.average_last} checkpoints: "
                         f"give --keep {args.average_last} or more (now {args.keep}) and --save-every above 0")
    if args.ema and args.average_last > 1:
        raise ValueError(f"--ema and --average-last {args.average_last} each make the final model: give one")
    if args.ema and args.resume:
        raise ValueError("--ema keeps the weights' moving average in memory only: a resumed run cannot continue it")
    if args.task == "seq2seq":
        if args.beams > MAX_BEAMS:
            raise ValueError(f"--beams {args.beams} is more than {MAX_BEAMS}")
        if not -MAX_LENGTH_PENALTY <= args.length_penalty <= MAX_LENGTH_PENALTY:
            raise ValueError(f"--length-penalty {args.length_penalty} is outside -{MAX_LENGTH_PENALTY} to "
                             f"{MAX_LENGTH_PENALTY}")
        for first, second in (("val_src", "val_tgt"), ("test_src", "test_tgt")):
            if (getattr(args, first) is None) != (getattr(args, second) is None):
                raise ValueError(f"--{first.replace('_', '-')} and --{second.replace('_', '-')} go together: "
                                 "give both or neither")
    if args.task == "classify":
        check_member_runs(args.ensemble_with or [], args.val)
    if args.task == "classify" and args.init:
        config = config_of(args.init)
        if config is None:  # a Hub id not downloaded yet: the load checks it
            return
        if config.arch != "encoder":
            raise ValueError(f"--init {one_line(args.init, 100)} is a {config.arch}; classify fine-tunes an encoder")
        labels = len(args.labels.split(",")) if args.labels else config.num_labels
        config = config.replace(head="sequence-classification", num_labels=labels, pooling=args.pooling)
    else:
        config = planned_config(args, Path(args.out))
    tokens = min(config.max_seq_len, args.max_len if args.task == "classify" else config.max_seq_len)
    shape = (f"the run's model (d_model {config.d_model:,}, {config.n_layers:,} layers, d_ff {config.d_ff:,}, "
             f"{tokens:,} positions, vocabulary {config.vocab_size:,}, batch {args.batch_size:,})")
    check_training_memory(config, args.batch_size, tokens, args.device, shape)


def run(args) -> int:
    check_arguments(args)
    import numpy as np

    from ..heap import keep_freed_buffers
    from . import distributed
    from .build import BUILDERS, RUN_CONFIG
    from .checkpoint import checkpoint_candidates, remove_temporaries, save_trained, write_text_atomically
    from .metrics import METRICS
    from .trainer import Trainer

    keep_freed_buffers()  # every step's temporaries reused, not faulted in again (heap.py)
    info = distributed.setup(args.device)
    run_dir = Path(args.out)
    lock = None
    try:
        lock = _lock(run_dir, info)
        if info.is_main:
            remove_temporaries(run_dir)  # from writers killed mid-save: only we write here now
        # every rank checks (reading only), so that all of them stop, not just rank 0
        if not args.resume and checkpoint_candidates(run_dir):
            raise ValueError(f"{run_dir} already holds checkpoints: pass --resume to continue, "
                             f"or choose another --out")
        if info.is_main and not args.resume:  # a fresh run forgets any half-started one in the same directory
            for stale in (RUN_CONFIG, "tokenizer.json", METRICS):
                (run_dir / stale).unlink(missing_ok=True)
        distributed.barrier()
        random.seed(args.seed)
        np.random.seed(args.seed % 2**32)  # numpy takes 32 bits
        model, task, tok = BUILDERS[args.task](args, run_dir, info)
        if info.is_main:
            write_text_atomically(run_dir / "train_args.json", json.dumps(plain_arguments(args, tok), indent=1))
            if not args.quiet:
                print(summary(args, model, task, tok, info), flush=True)
        trainer = Trainer(model, task, train_config(args), run_dir, info, resume=args.resume,
                          d_model=model.config.d_model)
        history = trainer.fit()
        if info.is_main:
            out = save_trained(trainer.model, tok, run_dir / "model")
            final = {k: v for r in history for k, v in r.items() if k != "step"}
            shown = ("loss", "val_loss", "val_accuracy", "ensemble_accuracy", "bleu")
            done = ", ".join(f"{k} {final[k]:.4f}" for k in shown if k in final)
            if not args.quiet:
                print(f"done: {done}; model in {printable(str(out))}")
        return 0
    finally:
        if lock is not None:
            lock.release()
        distributed.cleanup()
