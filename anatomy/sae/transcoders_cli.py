"""`anatomy sae train-transcoders | eval-transcoders`: a transcoder on every layer, trained from one harvest.

    anatomy sae train-transcoders --model smollm2 --data input.txt --features 2304 --k 32 --out runs/tc
    anatomy sae eval-transcoders runs/tc --data heldout.txt    # per layer FVE, L0, dead; CE loss recovered

One pass of the model per fill of contexts records every layer's MLP input and output (stopping at the
last MLP: no final norm, no LM head) into one buffer of rows, each row every layer's pair side by side;
each layer's transcoder reads its own columns of the same shuffled batches, and one process trains them
all (train.py). The buffer is bounded by --buffer-memory whatever the data size, and the command says
what it will hold before it starts (and refuses to start when that is more than the memory available).
At the end the run folder holds transcoders/ (circuit-tracer's layout: circuit-tracer and
anatomy.load_transcoders read it), eval.json and transcoders.png. `--resume` continues a killed run;
under torchrun each rank harvests its own share of the contexts.
"""

from __future__ import annotations

import json

from ..arguments import add_model_argument, input_file, non_negative_int, positive_float, positive_int, text
from ..progress import Stages
from ..terminal import one_line, printable, summary_block
from .cli_common import add_corpus_arguments, add_run_arguments, add_training_arguments, load_model, train_config, training_run

# torch, the model and the trainer are imported by the functions that use them, once the arguments have been
# checked: a mistake is refused before torch loads.
KINDS = ("batchtopk", "jumprelu", "relu")  # what circuit-tracer reads (BatchTopK is a JumpReLU in use)
STORE_DTYPES = ("bfloat16", "float32")  # torch's names
GiB = 2**30
RUNTIME_BYTES = 300 * 2**20  # the interpreter, torch and the tokenizer before any tensor: measured ~0.3 GB


def add_arguments(commands) -> None:
    """The two commands, added to `anatomy sae`'s sub-commands (with the option groups of cli_common.py)."""
    train = commands.add_parser("train-transcoders", help="train a transcoder on every layer, from one harvest")
    add_model_argument(train, help="the model whose MLPs the transcoders replace")
    add_corpus_arguments(train)
    g = train.add_argument_group("the transcoders")
    g.add_argument("--kind", choices=KINDS, default="batchtopk",
                   help="the kinds circuit-tracer reads: batchtopk (a JumpReLU in use), jumprelu, relu")
    g.add_argument("--features", type=positive_int, default=2304, help="features per layer")
    g.add_argument("--k", type=positive_float, default=32, help="batchtopk: active features per token on average")
    g.add_argument("--l1", type=positive_float, default=5e-3, help="relu: the L1 coefficient")
    g.add_argument("--l0", type=positive_float, default=1e-3, help="jumprelu: the L0 coefficient")
    g.add_argument("--no-skip", action="store_true", help="no skip connection (default: a linear path x W_skip^T)")
    g.add_argument("--input-point", type=text,
                   help="what each reads, L for the layer (default: the MLP's input, blocks.L.mlp_norm.out in a pre-norm block)")
    g.add_argument("--output-point", type=text, default="blocks.L.mlp.out", help="what each predicts, L for the layer")
    g = train.add_argument_group("activations")
    g.add_argument("--context", type=positive_int, default=128, help="tokens per context")
    g.add_argument("--skip", type=non_negative_int, default=1,
                   help="leading positions of each context left out (1: the first token's outlier)")
    g.add_argument("--buffer-memory", type=positive_float, default=1.0,
                   help="GiB of harvested rows held at once: the memory bound of the data")
    g.add_argument("--store-dtype", choices=STORE_DTYPES, default="bfloat16",
                   help="how the harvested rows are held (bfloat16: half the memory)")
    g.add_argument("--eval-rows", type=positive_int, default=4096, help="held-out rows for the periodic FVE")
    g = train.add_argument_group("training")
    add_training_arguments(g, max_steps=1000, batch_size=1024, lr=4e-3, warmup=50, dead_tokens=250_000, save_every=250,
                           ce_contexts=32)
    g.add_argument("--eval-tokens", type=positive_int, help="held-out tokens the final evaluation reads (default: all)")
    add_run_arguments(train)

    evaluate = commands.add_parser("eval-transcoders",
                                   help="per layer FVE, L0, dead; CE loss recovered with every MLP replaced at once")
    evaluate.add_argument("transcoders", metavar="RUN_OR_FOLDER", help="a run folder, a circuit-tracer or Gemma Scope 2 folder")
    add_model_argument(evaluate, named_by="the transcoder set's files", help="the model")
    evaluate.add_argument("--data", required=True, nargs="+", type=input_file, help="held-out UTF-8 text files")
    evaluate.add_argument("--context", type=positive_int, default=128, help="tokens per context")
    evaluate.add_argument("--skip", type=non_negative_int, default=1, help="leading positions of each context left out")
    evaluate.add_argument("--ce-contexts", type=non_negative_int, default=32,
                          help="contexts for the CE loss recovered, five passes each (0: skip it)")
    evaluate.add_argument("--max-tokens", type=positive_int, help="read at most this many tokens of --data")
    evaluate.add_argument("--variant", type=text, help="Gemma Scope 2: which width_W_l0_S[_affine] folder")
    add_run_arguments(evaluate)


def memory_plan(model, n_layers: int, d_in: int, d_out: int, features: int, skip: bool, fill_rows: int,
                row_width: int, store_dtype: torch.dtype, batch_size: int, eval_rows: int, harvest_rows: int
                ) -> dict[str, int]:
    """Bytes held at once, by what holds them, from the sizes alone (before anything is allocated): the
    runtime; the model; one fill of harvested rows and a batch drawn from it, and one harvest pass's values in float32
    three times over (the points recorded, their positions kept, side by side) before they are stored; the
    transcoders with their gradients, Adam's two moments and the copy a checkpoint writes; the held-out
    rows; one transcoder's step (its pre-activations and their copies)."""
    parameters = n_layers * (d_in * features + 2 * features + features * d_out + d_out + (d_out * d_in if skip else 0))
    return {"python and torch": RUNTIME_BYTES,
            "model": sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())),
            "activations": (fill_rows + batch_size) * row_width * store_dtype.itemsize + 3 * harvest_rows * row_width * 4,
            "transcoders": 5 * parameters * 4,
            "held-out rows": eval_rows * row_width * store_dtype.itemsize,
            "a step": 4 * batch_size * (3 * features + 4 * (d_in + d_out))}


def run_train_transcoders(args) -> int:
    """Harvest, train every layer, save transcoders/ and eval.json, draw transcoders.png (module docstring)."""
    import torch

    from ..checkpoints.memory import available_memory
    from .evaluate import evaluate_transcoders
    from .modules import SAE
    from .plots import plot_training
    from .store import ActivationStore, corpus_tokens, harvest, rows_of
    from .train import SAETrainer, write_summary
    from .transcoder_files import save_transcoders
    from .transcoders import TranscoderSet, mlp_points, points_of

    with training_run(args) as (info, run_dir), Stages(quiet=args.quiet or not info.is_main,
                                                        bar=not args.no_progress) as stages:
        stages.start("loading the model")
        model = load_model(args.model, str(info.device))
        args.input_point = args.input_point or mlp_points(model)[0]
        n_layers = len(model.blocks)
        points = points_of(args.input_point, args.output_point, n_layers)
        probe = TranscoderSet([SAE(model.config.d_model, 1, kind="relu", transcoder=True, seed=None) for _ in range(n_layers)],
                              input_point=args.input_point, output_point=args.output_point)
        probe.check_fits(model)  # the points exist in every block, at d_model: refused before any pass
        stages.start("reading the text")
        train_tokens, held_tokens = corpus_tokens(args.data, model.tokenizer, args.eval_fraction)
        widths = [v.flatten(2).size(-1) for v in harvest(model, torch.as_tensor(train_tokens[None, :8]), points[:2])]
        store_dtype = getattr(torch, args.store_dtype)
        row_width = n_layers * sum(widths)
        fill_rows = max(args.batch_size, int(args.buffer_memory * GiB) // (row_width * store_dtype.itemsize))
        store = ActivationStore(model, points, train_tokens, context=args.context, batch_size=args.batch_size,
                                fill_tokens=fill_rows, skip=args.skip, seed=args.seed, rank=info.rank,
                                world_size=info.world_size, dtype=store_dtype)
        k = args.k if args.kind == "batchtopk" else None
        plan = memory_plan(model, n_layers, widths[0], widths[1], args.features, not args.no_skip,
                           min(fill_rows, store.rows), row_width, store_dtype, args.batch_size, args.eval_rows,
                           store.harvest_batch * (args.context - args.skip))
        if sum(plan.values()) > available_memory():
            raise ValueError(f"training would hold {sum(plan.values()) / GiB:.1f} GiB, more than the "
                             f"{available_memory() / GiB:.1f} GiB available: lower --buffer-memory, --features or --batch-size")
        metadata = {"model_name": args.model, "context_size": args.context, "dataset_path": " ".join(args.data)}
        saes = [SAE(widths[0], args.features, kind=args.kind, k=k, d_out=widths[1], point=points[2 * layer],
                    point_out=points[2 * layer + 1], transcoder=True, skip=not args.no_skip, seed=args.seed + layer,
                    metadata=metadata) for layer in range(n_layers)]
        config = train_config(args, k)
        stages.start("harvesting the held-out rows")
        eval_rows = rows_of(model, points, held_tokens, context=args.context, skip=args.skip,
                            limit=args.eval_rows)[:args.eval_rows].to(store_dtype)
        if info.is_main:
            write_summary(run_dir, config, {"model": args.model, "input_point": args.input_point,
                                            "output_point": args.output_point, "skip_connection": not args.no_skip,
                                            "data": args.data, "context": args.context, "skip": args.skip,
                                            "eval_fraction": args.eval_fraction, "store_dtype": args.store_dtype,
                                            "buffer_memory_gib": args.buffer_memory})
            if not args.quiet:
                print(_start_summary(args, run_dir, n_layers, widths, k, train_tokens, held_tokens, store, plan,
                                     fill_rows, info.world_size), flush=True)
        trainer = SAETrainer(saes, store, config, run_dir, eval_rows=eval_rows, dist=info, resume=args.resume,
                             offsets=[layer * sum(widths) for layer in range(n_layers)])
        stages.start("training")
        with stages.handed_over():  # the trainer's own bar, or its log lines
            trainer.fit()
        if info.is_main:
            transcoders = TranscoderSet(trainer.trained_saes(), input_point=args.input_point,
                                        output_point=args.output_point, metadata={"model_name": args.model})
            save_transcoders(transcoders, run_dir / "transcoders", scan=f"anatomy/{run_dir.resolve().name}")
            trainer.store = trainer.eval_rows = store = eval_rows = None  # the buffer's memory, for the evaluation
            results = evaluate_transcoders(model, transcoders, held_tokens[:args.eval_tokens], context=args.context,
                                           skip=args.skip, ce_contexts=args.ce_contexts,
                                           progress=stages.start("evaluating", "contexts"))
            (run_dir / "eval.json").write_text(json.dumps(results, indent=1) + "\n")
            trainer.log_record({"step": trainer.step, **{f"heldout_{k}": v for k, v in results.items() if k != "layers"}})
            plot_training(run_dir, trainer.history, name="transcoders.png",
                          title=f"{printable(args.model)}: a transcoder on each of {n_layers} layers, means over the layers")
            if not args.quiet:
                print(describe(results, "held out") + f"\ntranscoders in {printable(str(run_dir / 'transcoders'))}")
        return 0


def _start_summary(args, run_dir, n_layers, widths, k, train_tokens, held_tokens, store, plan, fill_rows, world) -> str:
    per_step = args.batch_size * world
    memory = ", ".join(f"{name} {_size(value)}" for name, value in plan.items())
    return summary_block(f"anatomy sae train-transcoders -> {printable(str(run_dir))}", [
        ("model", f"{printable(args.model)}: {n_layers} layers, {printable(args.input_point)} -> "
                  f"{printable(args.output_point)}"),
        ("transcoders", f"{args.kind}, {widths[0]} -> {args.features:,} features{f' (k {k:g})' if k else ''} -> "
                        f"{widths[1]}{'' if args.no_skip else ', with a skip connection'}, one per layer"),
        ("data", f"{len(train_tokens):,} tokens train ({store.rows:,} rows an epoch), {len(held_tokens):,} held out"),
        ("steps", f"{args.max_steps:,} x {per_step:,} rows = {args.max_steps * per_step / store.rows:.2f} epochs; "
                  f"every fill of {min(fill_rows, store.rows):,} rows harvested once an epoch, every layer at once"),
        ("memory", f"{_size(sum(plan.values()))} at most: {memory}"),
    ])


def _size(count: int) -> str:
    return f"{count / GiB:.2f} GiB" if count >= GiB / 10 else f"{count / 2**20:.1f} MB"


def describe(results: dict, title: str, text: str | None = None) -> str:
    """A set's evaluation in 80 columns: one row per layer (FVE, L0, dead), then the means and the CE loss."""
    lines = [summary_block(title, [("text", one_line(text))] if text else [])]  # a long path folds to 80 columns
    lines.append(f"  {'layer':>5}  {'FVE':>6}  {'L0':>7}  {'dead':>6}")
    for layer, r in enumerate(results["layers"]):
        lines.append(f"  {layer:>5}  {r['fve']:>6.3f}  {r['l0']:>7.1f}  {r['dead']:>6.1%}")
    lines.append(f"  {'mean':>5}  {results['fve']:>6.3f}  {results['l0']:>7.1f}  {results['dead']:>6.1%}")
    if "loss_recovered" in results:
        lines.append(summary_block("", [
            ("replaced", f"every MLP at once, no error terms: CE {results['ce_replaced']:.3f}, "
                         f"{results['loss_recovered']:.3f} of the loss recovered"),
            ("with errors", f"CE {results['ce_with_errors']:.4f}, {results['loss_recovered_with_errors']:.4f} recovered "
                            f"(the model's own: {results['ce_clean']:.4f})"),
            ("zero", f"every MLP zero-ablated: CE {results['ce_zero']:.3f}"),
        ] + ([("vs mean", f"every MLP at its mean: CE {results['ce_mean']:.3f}; the replacement recovers "
                          f"{results['loss_recovered_vs_mean']:.3f} of the loss against that")]
             if "ce_mean" in results else [])).lstrip("\n"))
    return "\n".join(lines)


def run_eval_transcoders(args) -> int:
    """Print a set's per-layer FVE, L0, dead and its CE loss recovered on the text of --data."""
    from .evaluate import evaluate_transcoders
    from .store import corpus_tokens
    from .transcoder_files import load_transcoders

    with Stages.of(args) as stages:
        stages.start("loading the transcoders")
        transcoders = load_transcoders(args.transcoders, variant=args.variant)
        name = args.model or transcoders.metadata.get("model_name")
        if not name:
            raise ValueError(f"{args.transcoders} does not name its model: pass --model")
        stages.start("loading the model")
        model = load_model(name, args.device)
        transcoders.check_fits(model)
        transcoders.to(args.device)
        stages.start("reading the text")
        tokens = corpus_tokens(args.data, model.tokenizer, eval_fraction=None)[0]
        tokens = tokens[:args.max_tokens] if args.max_tokens else tokens
        results = evaluate_transcoders(model, transcoders, tokens, context=args.context, skip=args.skip,
                                       ce_contexts=args.ce_contexts, progress=stages.start("evaluating", "contexts"))
    if not args.quiet:
        print(describe(results, f"anatomy sae eval-transcoders {printable(args.transcoders)}",
                       text=f"{len(tokens):,} tokens of {' '.join(args.data)}"))
    return 0
