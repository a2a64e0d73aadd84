"""`anatomy sae train|eval|features|train-transcoders|eval-transcoders`: train an SAE or a transcoder, measure
it, show its features; a transcoder on every layer (transcoders_cli.py).

    anatomy sae train --model smollm2 --point blocks.15.resid_post --data input.txt --features 4608 --k 32 --out runs/sae
    anatomy sae eval runs/sae --data heldout.txt                  # L0, FVE, CE loss recovered, dead, dense
    anatomy sae features runs/sae --data text.txt --out features.html
    anatomy sae train-transcoders --model smollm2 --data input.txt --out runs/tc   # every layer, one harvest

A run folder holds sae_train_config.json, metrics.jsonl, sae.png, checkpoints/, and at the end sae/
(SAELens's format) and eval.json. `--resume` continues a killed run; under torchrun the run trains with
DistributedDataParallel. RUN_OR_FOLDER is a run folder, an SAE folder (SAELens or Gemma Scope) or a Hub id.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..arguments import add_model_argument, input_file, non_negative_int, output_file, positive_float, positive_int, text
from ..progress import Stages
from ..terminal import printable, summary_block
from . import transcoders_cli
from .choices import KINDS
from .cli_common import add_corpus_arguments, add_run_arguments, add_training_arguments, load_model, train_config, training_run

# The model, the trainer and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`anatomy sae train | eval | features` and their options."""
    commands = parser.add_subparsers(dest="sae_command", metavar="COMMAND", required=True)

    train = commands.add_parser("train", help="train an SAE (or a transcoder) on a model's activations")
    add_model_argument(train, help="the model whose activations the SAE reads")
    train.add_argument("--point", required=True, type=text,
                       help="the trace point it reads (blocks.12.resid_post; TransformerLens names too)")
    train.add_argument("--point-out", type=text,
                       help="a transcoder: the point it predicts (e.g. --point blocks.3.mlp_norm.out --point-out blocks.3.mlp.out)")
    add_corpus_arguments(train)
    g = train.add_argument_group("the SAE")
    g.add_argument("--kind", choices=KINDS, default="topk",
                   help="relu (an L1 penalty), topk (k features per token), batchtopk (k per token on average over "
                   "the batch), jumprelu (a threshold per feature, an L0 penalty)")
    g.add_argument("--features", type=positive_int, default=4608, help="d_sae")
    g.add_argument("--k", type=positive_float, default=32, help="active features per token (topk, batchtopk; default 32)")
    g.add_argument("--l1", type=positive_float, default=5e-3, help="relu: the L1 coefficient")
    g.add_argument("--l0", type=positive_float, default=1e-3, help="jumprelu: the L0 coefficient")
    g = train.add_argument_group("activations")
    g.add_argument("--context", type=positive_int, default=128, help="tokens per context")
    g.add_argument("--skip", type=non_negative_int, default=1,
                   help="leading positions of each context left out (1: the first token's outlier)")
    g.add_argument("--fill-tokens", type=positive_int, default=2**18, help="rows harvested per fill: the memory bound")
    g.add_argument("--shards", help="keep the harvested activations in this folder (safetensors), for later epochs and runs")
    add_training_arguments(train.add_argument_group("training"), max_steps=2000, batch_size=4096, lr=4e-4, warmup=100,
                           dead_tokens=500_000, save_every=500, ce_contexts=64)
    add_run_arguments(train)

    evaluate = commands.add_parser("eval", help="L0, variance explained, CE loss recovered, dead and dense features")
    evaluate.add_argument("sae", metavar="RUN_OR_FOLDER", help="a run folder, an SAE folder or a Hub id")
    add_model_argument(evaluate, named_by="the SAE's files", help="the model")
    evaluate.add_argument("--data", required=True, nargs="+", type=input_file, help="held-out UTF-8 text files")
    evaluate.add_argument("--context", type=positive_int, default=128, help="tokens per context")
    evaluate.add_argument("--skip", type=non_negative_int, default=1,
                          help="leading positions of each context left out")
    evaluate.add_argument("--ce-contexts", type=non_negative_int, default=64,
                          help="contexts for the cross-entropy loss recovered, three passes each (0: skip it)")
    evaluate.add_argument("--max-tokens", type=positive_int, help="read at most this many tokens of --data")
    evaluate.add_argument("--point", type=text, help="the point it reads, when its files do not say")
    evaluate.add_argument("--layer", type=non_negative_int, help="a transcoder set: the layer whose transcoder to read")
    add_run_arguments(evaluate)

    features = commands.add_parser("features", help="one offline page: every feature's top contexts, density, logits")
    features.add_argument("sae", metavar="RUN_OR_FOLDER", help="a run folder, an SAE folder or a Hub id")
    add_model_argument(features, named_by="the SAE's files", help="the model")
    features.add_argument("--data", required=True, nargs="+", type=input_file,
                          help="UTF-8 text files to find the top contexts in")
    features.add_argument("--out", required=True, type=output_file(".html", ".htm"), help="the HTML file to write")
    features.add_argument("--top", type=positive_int, default=12, help="top contexts per feature")
    features.add_argument("--context", type=positive_int, default=128, help="tokens per context")
    features.add_argument("--skip", type=non_negative_int, default=1,
                          help="leading positions of each context left out")
    features.add_argument("--max-tokens", type=positive_int, help="read at most this many tokens of --data")
    features.add_argument("--point", type=text, help="the point it reads, when its files do not say")
    features.add_argument("--layer", type=non_negative_int, help="a transcoder set: the layer whose features to show")
    add_run_arguments(features)

    transcoders_cli.add_arguments(commands)


def run(args: argparse.Namespace) -> int:
    """Run the sae command named on the command line; 0 on success."""
    return {"train": run_train, "eval": run_eval, "features": run_features,
            "train-transcoders": transcoders_cli.run_train_transcoders,
            "eval-transcoders": transcoders_cli.run_eval_transcoders}[args.sae_command](args)


def run_train(args) -> int:
    """Harvest, train, save sae/ and eval.json, draw sae.png (module docstring); under torchrun, one rank each."""
    import torch

    from .evaluate import evaluate
    from .formats import save_sae
    from .modules import SAE
    from .store import ActivationStore, corpus_tokens, harvest, rows_of
    from .train import SAETrainer, write_summary
    from ..trace import anatomy_name, trace

    with training_run(args) as (info, run_dir), Stages(quiet=args.quiet or not info.is_main,
                                                        bar=not args.no_progress) as stages:
        stages.start("loading the model")
        points = [args.point] + ([args.point_out] if args.point_out else [])
        model = load_model(args.model, str(info.device), points)
        stages.start("reading the text")
        train_tokens, held_tokens = corpus_tokens(args.data, model.tokenizer, args.eval_fraction)
        shards = Path(args.shards) / _shard_key(args, points) if args.shards else None
        store = ActivationStore(model, points, train_tokens, context=args.context, batch_size=args.batch_size,
                                fill_tokens=args.fill_tokens, skip=args.skip, seed=args.seed, rank=info.rank,
                                world_size=info.world_size, shards=shards)
        probe = torch.as_tensor(train_tokens[None, :8])
        widths = [v.flatten(2).size(-1) for v in harvest(model, probe, points)]
        if args.point_out:
            with torch.no_grad(), trace(model, points) as reached:
                model(probe)
            if list(reached)[0] != anatomy_name(args.point):
                raise ValueError(f"a transcoder predicts a later point from an earlier one; in {args.model!r} "
                                 f"{args.point_out!r} comes before {args.point!r}")
        k = args.k if args.kind in ("topk", "batchtopk") else None
        sae = SAE(widths[0], args.features, kind=args.kind, k=int(k) if args.kind == "topk" else k,
                  d_out=widths[-1], point=args.point, point_out=args.point_out, seed=args.seed,
                  metadata={"model_name": args.model, "context_size": args.context, "dataset_path": " ".join(args.data)})
        config = train_config(args, k)
        stages.start("harvesting the held-out rows")
        eval_rows = rows_of(model, points, held_tokens, context=args.context, skip=args.skip, limit=16384)
        if info.is_main:
            write_summary(run_dir, config, {"model": args.model, "point": args.point, "point_out": args.point_out,
                                            "data": args.data, "context": args.context, "skip": args.skip,
                                            "eval_fraction": args.eval_fraction})
            if not args.quiet:
                per_step = args.batch_size * info.world_size
                kept = f"activations kept in {printable(str(shards))}" if shards else "activations harvested each epoch"
                print(summary_block(f"anatomy sae train -> {printable(str(run_dir))}", [
                    ("SAE", f"{args.kind}, {widths[0]} -> {args.features:,} features{f' (k {k:g})' if k else ''} "
                            f"-> {widths[-1]}, at {printable(' -> '.join(points))}"),
                    ("data", f"{len(train_tokens):,} tokens train ({store.rows:,} rows an epoch), "
                             f"{len(held_tokens):,} held out"),
                    ("steps", f"{args.max_steps:,} x {per_step:,} rows = {args.max_steps * per_step / store.rows:.1f} "
                              f"epochs; {kept}")]), flush=True)
        trainer = SAETrainer(sae, store, config, run_dir, eval_rows=eval_rows, dist=info, resume=args.resume)
        stages.start("training")
        with stages.handed_over():  # the trainer's own bar, or its log lines
            trainer.fit()
        if info.is_main:
            final = trainer.trained_sae()
            save_sae(final, run_dir / "sae")
            results = evaluate(model, final, held_tokens, context=args.context, skip=args.skip,
                               ce_contexts=args.ce_contexts, progress=stages.start("evaluating", "contexts"))
            (run_dir / "eval.json").write_text(json.dumps(results, indent=1) + "\n")
            trainer.log_record({"step": trainer.step, **{f"heldout_{k}": v for k, v in results.items()}})
            from .plots import plot_training

            plot_training(run_dir, trainer.history)
            if not args.quiet:
                print(_describe(results, "held out") + f"\nSAE in {printable(str(run_dir / 'sae'))}")
        return 0


def _shard_key(args, points) -> str:
    """Shards are reused only by a run of the same model, points, data, context, skip, fill and seed."""
    import hashlib

    key = json.dumps([args.model, points, [str(Path(d).resolve()) for d in args.data], args.eval_fraction, args.context,
                      args.skip, args.fill_tokens, args.seed, args.batch_size])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _describe(results: dict, title: str, text: str | None = None) -> str:
    """The evaluation's numbers under `title`, one quantity a row (the text read first, when named), in 80 columns."""
    rows = [("text", text)] if text else []
    rows += [("L0", f"{results['l0']:.1f} active features per token"),
            ("FVE", f"{results['fve']:.3f} of the variance explained")]
    if "loss_recovered" in results:
        rows.append(("CE", f"{results['loss_recovered']:.3f} of the loss recovered (clean {results['ce_clean']:.3f}, "
                           f"spliced {results['ce_spliced']:.3f}, zero-ablated {results['ce_zero']:.3f})"))
    rows += [("features", f"{results['dead']:.1%} dead, {results['dense']:.1%} dense"),
             ("tokens", f"{results['tokens']:,} ({results.get('outliers', 0):,} attention-sink outliers left out)")]
    return summary_block(f"{title}:", rows)


def _sae_model_tokens(args, stages: Stages):
    """(sae, model, tokens of --data, the first --max-tokens of them) for eval and features; the model
    named by --model or the SAE."""
    from .formats import load_sae
    from .store import corpus_tokens

    for path in args.data:
        if not Path(path).is_file():
            raise FileNotFoundError(2, "no such file", path)
    stages.start("loading the SAE")
    sae = _layer_of_set(args) if _is_set(args.sae) or args.layer is not None else load_sae(args.sae, point=args.point)
    name = args.model or sae.metadata.get("model_name")
    if not name:
        raise ValueError(f"{args.sae} does not name its model: pass --model")
    if sae.point is None:
        raise ValueError(f"{args.sae} does not say which point it reads: pass --point")
    stages.start("loading the model")
    model = load_model(name, args.device, [p for p in (sae.point, sae.point_out) if p])
    stages.start("reading the text")
    tokens = corpus_tokens(args.data, model.tokenizer, eval_fraction=None)[0]
    return sae.to(args.device), model, tokens[:args.max_tokens] if args.max_tokens else tokens


def _is_set(source: str) -> bool:
    """Whether `source` is a transcoder set's folder (circuit-tracer's config.yaml) or a run holding one."""
    from .transcoder_files import CONFIG, RUN_FOLDER

    return (Path(source) / CONFIG).is_file() or (Path(source) / RUN_FOLDER / CONFIG).is_file()


def _layer_of_set(args):
    """The transcoder of layer --layer of the set at args.sae (a per-layer set's), named by the set's model."""
    from .transcoder_files import load_transcoders

    transcoders = load_transcoders(args.sae)
    if args.layer is None or args.layer >= transcoders.n_layers:
        raise ValueError(f"{args.sae} holds a transcoder for each of {transcoders.n_layers} layers: choose one with "
                         f"--layer 0 .. {transcoders.n_layers - 1}")
    if transcoders.cross_layer:
        raise ValueError(f"{args.sae} is a cross-layer transcoder: its features write to every later layer, not one "
                         "point; allowed here: a per-layer set")
    sae = transcoders.layers[args.layer]
    sae.metadata = {**transcoders.metadata, **sae.metadata}
    return sae


def _stats(args) -> dict | None:
    """The run's eval.json for the page's header: the layer's own numbers when a set's layer is shown."""
    from .features import stats_of

    stats = stats_of(args.sae) if Path(args.sae).is_dir() else None
    if stats and "layers" in stats:
        layers = stats["layers"]
        return layers[args.layer] if args.layer is not None and args.layer < len(layers) else None
    return stats


def run_eval(args) -> int:
    """Print L0, FVE, CE loss recovered, dead and dense of an SAE on the text of --data."""
    from .evaluate import evaluate

    with Stages.of(args) as stages:
        sae, model, tokens = _sae_model_tokens(args, stages)
        results = evaluate(model, sae, tokens, context=args.context, skip=args.skip, ce_contexts=args.ce_contexts,
                           progress=stages.start("evaluating", "contexts"))
    if not args.quiet:
        print(_describe(results, f"anatomy sae eval {printable(args.sae)}",
                        text=f"{len(tokens):,} tokens of {printable(' '.join(args.data))}"))
    return 0


def run_features(args) -> int:
    """Write the feature page of an SAE over the text of --data."""
    from .features import feature_page

    with Stages.of(args) as stages:
        sae, model, tokens = _sae_model_tokens(args, stages)
        view = feature_page(model, sae, tokens, context=args.context, skip=args.skip, top=args.top,
                            stats=_stats(args), progress=stages.start("finding the top contexts", "contexts"))
        stages.start("writing the page")
        out = view.save(args.out)
    if not args.quiet:
        print(f"{printable(str(out))}: {sae.d_sae:,} features, {len(view.html) / 1e6:.1f} MB; {stages.times()}")
    return 0
