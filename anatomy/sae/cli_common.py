"""What the `anatomy sae` commands share: their option groups, the model loaded and checked, and a
training run's folder. sae/cli.py (train, eval, features) and transcoders_cli.py (train-transcoders,
eval-transcoders) both build on it.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

from ..arguments import (add_compute_arguments, input_file, non_negative_int, output_folder, positive_float, positive_int,
                         probability)

# The model, the trainer and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.


def add_training_arguments(g, *, max_steps: int, batch_size: int, lr: float, warmup: int, dead_tokens: int,
                           save_every: int, ce_contexts: int) -> None:
    """The optimisation options of a training command (sae train, train-transcoders), with its defaults."""
    g.add_argument("--max-steps", type=positive_int, default=max_steps, help="optimizer steps")
    g.add_argument("--batch-size", type=positive_int, default=batch_size, help="rows per step and rank")
    g.add_argument("--lr", type=positive_float, default=lr,
                   help="Adam's peak learning rate, reached after --warmup, then a cosine down to lr x --min-lr-ratio")
    g.add_argument("--warmup", type=non_negative_int, default=warmup, help="steps of linear warm-up to --lr")
    g.add_argument("--min-lr-ratio", type=probability, default=0.0, help="the cosine ends at lr x this")
    g.add_argument("--aux-k", type=positive_int, help="dead features per row in AuxK (default: half the width)")
    g.add_argument("--aux-coefficient", type=probability, default=1 / 32,
                   help="topk, batchtopk: weight of AuxK, the loss by which dead features learn the error")
    g.add_argument("--dead-tokens", type=positive_int, default=dead_tokens, help="tokens without firing = dead")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the first weights (a set's layer L: seed + L) and of the order the activations are read in")
    g.add_argument("--log-every", type=positive_int, default=10, help="steps between log lines")
    g.add_argument("--eval-every", type=non_negative_int, default=100,
                   help="steps between held-out evaluations (0: only at the end)")
    g.add_argument("--save-every", type=non_negative_int, default=save_every,
                   help="steps between checkpoints (0: only at the end)")
    g.add_argument("--ce-contexts", type=non_negative_int, default=ce_contexts,
                   help="held-out contexts for the cross-entropy loss recovered (0: skip it)")


def add_corpus_arguments(train: argparse.ArgumentParser) -> None:
    """--data, --eval-fraction, --out and --resume: the text a training command reads and the run
    folder it writes (sae train, train-transcoders)."""
    train.add_argument("--data", required=True, nargs="+", type=input_file, help="UTF-8 text files")
    train.add_argument("--eval-fraction", type=probability, default=0.05,
                       help="the last share of each file held out for evaluation")
    train.add_argument("--out", required=True, type=output_folder, help="run folder")
    train.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --out")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --threads and --no-progress (every computing command's), and --quiet: what every sae command takes."""
    add_compute_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")


def load_model(name: str, device: str, points=()):
    """The model, in evaluation mode, after checking it has a tokenizer and the trace points `points`."""
    from ..checkpoints import from_pretrained
    from ..trace import anatomy_name, trace_points

    model = from_pretrained(name).to(device).eval()
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"{name!r} has no tokenizer: the text cannot be read")
    available = trace_points(model)
    for point in points:
        if anatomy_name(point) not in available:
            block = sorted({n.split(".", 2)[2] for n in available if n.startswith("blocks.0.")})
            raise ValueError(f"{name!r} has no trace point {point!r}; it has {len(model.blocks)} blocks, each with "
                             f"blocks.L.{{{', '.join(block)}}} (anatomy.trace_points lists them)")
    return model


@contextmanager
def training_run(args):
    """(distributed info, run folder) for a training command, in a block: torchrun's process group set up,
    the run folder locked (rank 0), its temporaries from a killed run removed, and a run that already holds
    checkpoints refused unless --resume; the lock released and the group left at the end, however it ends."""
    from ..training import distributed
    from ..training.checkpoint import checkpoint_candidates, remove_temporaries
    from ..training.metrics import METRICS
    from ..training.rundir import RunLock

    info = distributed.setup(args.device)
    run_dir = Path(args.out)
    lock = RunLock(run_dir).acquire() if info.is_main else None
    try:
        if info.is_main:
            remove_temporaries(run_dir)
        if not args.resume and checkpoint_candidates(run_dir):
            raise ValueError(f"{run_dir} already holds checkpoints: pass --resume to continue, or choose another --out")
        if info.is_main and not args.resume:
            (run_dir / METRICS).unlink(missing_ok=True)
        yield info, run_dir
    finally:
        if lock is not None:
            lock.release()
        distributed.cleanup()


def train_config(args, k):
    """The SAETrainConfig of a training command's options (`k` as the kind takes it)."""
    from .train import SAETrainConfig

    return SAETrainConfig(kind=args.kind, features=args.features, k=k, l1=args.l1, l0=args.l0, max_steps=args.max_steps,
                          batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, min_lr_ratio=args.min_lr_ratio,
                          aux_k=args.aux_k, aux_coefficient=args.aux_coefficient, dead_tokens=args.dead_tokens,
                          seed=args.seed, log_every=args.log_every, eval_every=args.eval_every,
                          save_every=args.save_every, progress=not args.no_progress, quiet=args.quiet)
