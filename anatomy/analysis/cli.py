"""`anatomy analyze`: run one analysis on a model and a text, print its identity check, write its view.

    anatomy analyze lens "Hello World, this is Alejandro!" --model toy --out lens.html
    anatomy analyze heads --kind induction --model smollm2 --out heads.png
    anatomy analyze patch --clean "The cat sat" --corrupt "The dog sat" --point resid_pre --out patch.html
    anatomy analyze ig "The cat sat on the" --target " mat" --out ig.html
    anatomy analyze rollout "Hello World" --model toy-seq2seq --target-text "Hola Mundo,"

An encoder-decoder reads TEXT as the source and --target-text as the decoder's input.
"""

from __future__ import annotations

import argparse
import textwrap

from ..arguments import add_compute_arguments, add_model_argument, output_file, positive_int, text, within
from ..progress import Stages
from ..terminal import one_line, printable
from .choices import BY, KINDS

# The model, the analyses and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.

ANALYSES = {  # the analysis -> its name, as its stage is shown
    "lens": "the logit lens", "decompose": "the decomposition", "dla": "direct logit attribution",
    "patch": "activation patching", "ig": "integrated gradients", "gxi": "gradient x input",
    "rollout": "attention rollout", "heads": "head detection"}
# The options each analysis reads (None: the default below); any other given is refused, not ignored.
OPTIONS = {"target": ("ig", "gxi", "dla"), "point": ("patch",), "by": ("patch",), "kind": ("heads",),
           "steps": ("ig",), "clean": ("patch",), "corrupt": ("patch",)}
DEFAULTS = {"point": "resid_pre", "by": "position", "kind": "induction"}
MAX_STEPS = 4096  # ig: each step is one forward and backward pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("analysis", choices=ANALYSES, help="which analysis: " + ", ".join(ANALYSES))
    parser.add_argument("text", nargs="?", type=text, help="the input text (the source, for an encoder-decoder)")
    add_model_argument(parser)
    add_compute_arguments(parser)
    parser.add_argument("--target-text", type=text, help="encoder-decoder: the decoder's input text")
    parser.add_argument("--target", type=text,
                        help="ig, gxi, dla: the token whose logit is explained (default: the top prediction)")
    parser.add_argument("--clean", type=text, help="patch: the clean text")
    parser.add_argument("--corrupt", type=text, help="patch: the corrupted text (same number of tokens)")
    parser.add_argument("--point", help=f"patch: the point in each block (default: {DEFAULTS['point']})")
    parser.add_argument("--by", choices=BY, help=f"patch: one cell per position, head or layer (default: {DEFAULTS['by']})")
    parser.add_argument("--kind", choices=KINDS, help=f"heads: which kind to score (default: {DEFAULTS['kind']})")
    parser.add_argument("--steps", type=within(positive_int, 1, MAX_STEPS, "steps", " (each is a forward and a backward pass)"), help=f"ig: N points on the path from the baseline to the input, each a "
                        f"forward and a backward pass, at Gauss-Legendre nodes (Captum's rule; circuits discover's "
                        f"--steps counts the same, as a Riemann sum), 1 to {MAX_STEPS} (default: adaptive, until "
                        f"completeness is within 5%%)")
    parser.add_argument("--out", type=output_file(".html", ".png", ".svg"),
                        help="write the view: .html (interactive, offline), .png or .svg")


def unmet_need(analysis: str, config) -> str | None:
    """Why a model of `config` cannot run `analysis`, read from its config before it loads (the
    analyses raise the same for a loaded model); None when it can."""
    logits = config.arch == "encoder-decoder" or config.head in ("lm", "masked-lm")
    if analysis in ("lens", "dla", "ig", "gxi", "patch") and not logits:
        return f"{analysis} needs token logits, from an LM or masked-LM head; this model has head={config.head!r}"
    if analysis in ("decompose", "dla") and config.norm_position != "pre":
        return (f"{analysis} needs pre-norm blocks, where the residual stream is a sum of components; this model "
                f"has norm_position={config.norm_position!r}")
    if analysis in ("decompose", "dla") and config.embed_norm:
        return f"{analysis}: this model normalises its embeddings before the first block, so they are no sum of components"
    if analysis == "dla" and (config.lm_head_transform or config.final_logit_softcap is not None):
        return "dla needs a linear unembedding; this model has an LM-head transform or a logit soft-cap"
    return None


def check_arguments(args: argparse.Namespace) -> None:
    """Every argument against the analysis and the model's config, before the model loads."""
    analysis = args.analysis
    for option, users in OPTIONS.items():
        if getattr(args, option) is not None and analysis not in users:
            raise ValueError(f"--{option} is for {' and '.join(users)}, not {analysis}")
    if analysis in ("heads", "patch") and args.text is not None:
        scored = "repeated random tokens" if analysis == "heads" else "--clean and --corrupt"
        raise ValueError(f"{analysis} takes no TEXT: it runs on {scored}")
    if analysis == "patch" and (args.clean is None or args.corrupt is None):
        raise ValueError("anatomy analyze patch needs --clean and --corrupt texts")
    if analysis not in ("heads", "patch") and args.text is None:
        raise ValueError(f"anatomy analyze {analysis} needs TEXT")
    from ..checkpoints.describe import config_of

    config = config_of(args.model)
    if config is None:  # a Hub id not downloaded yet: the analysis checks the loaded model
        return
    reason = unmet_need(analysis, config)
    if reason:
        raise ValueError(f"--model {one_line(args.model, 100)}: {reason}")
    if config.arch == "encoder-decoder" and analysis != "heads" and args.target_text is None:
        raise ValueError("an encoder-decoder model needs --target-text (the decoder's input) beside the source TEXT")
    if config.arch != "encoder-decoder" and args.target_text is not None:
        raise ValueError(f"--target-text is for an encoder-decoder, not --model {one_line(args.model, 100)} "
                         f"(arch={config.arch})")


def _inputs(model, text: str | None, target_text: str | None, name: str = "TEXT"):
    if text is None:
        raise ValueError(f"anatomy analyze needs {name}")
    if model.config.arch == "encoder-decoder":
        if target_text is None:
            raise ValueError("an encoder-decoder model needs --target-text (the decoder's input) beside the source TEXT")
        return text, target_text
    return text


def _target_id(model, inputs, target: str | None) -> int:
    """The id of --target (one token), or the model's top prediction at the last position."""
    from .lens import logit_lens

    if target is None:
        return int(logit_lens(model, inputs).extra["top_ids"][-1, 0, -1, 0])
    tokenizer = model.tokenizer
    ids = tokenizer.encode(target, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"--target {target!r} is {len(ids)} tokens for this tokenizer; give text that is one token")
    return ids[0]


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    import torch

    from ..checkpoints import from_pretrained

    for option, default in DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    with Stages.of(args) as stages:
        stages.start("loading the model")
        model = from_pretrained(args.model, device=args.device).eval()
        torch.manual_seed(0)
        stages.start(ANALYSES[args.analysis])
        result, target_label = _analyse(args, model)
    baseline = None
    if "baseline_ids" in result.extra and getattr(model, "tokenizer", None) is not None:
        ids = result.extra["baseline_ids"].unique().tolist()
        baseline = (f", from the baseline '{model.tokenizer.labels(ids)[0]}' at every position" if len(ids) == 1
                    else ", from its baseline ids")
    result.about = _about(args, target_label, baseline)
    for line in (f"{result.kind}: {result.about}", f"{result.shape_text}", f"check: {result.check}"):
        print("\n".join(textwrap.wrap(printable(line), 80, subsequent_indent="  ", break_long_words=False)))
    print(_summary(result))
    if args.out:
        print(f"wrote {printable(str(result.save(args.out)))}")
    return 0


def _analyse(args: argparse.Namespace, model):
    """(the Result of the analysis asked for, the label of the token it explains or None)."""
    from .attribution import attention_rollout, gradient_x_input, integrated_gradients
    from .decompose import decompose, direct_logit_attribution
    from .heads import detect_heads
    from .lens import logit_lens
    from .patching import patch

    analysis, target_label = args.analysis, None
    if analysis == "heads":
        result = detect_heads(model, args.kind)
    elif analysis == "patch":
        if args.clean is None or args.corrupt is None:
            raise ValueError("anatomy analyze patch needs --clean and --corrupt texts")
        clean = _inputs(model, args.clean, args.target_text, "--clean")
        corrupt = _inputs(model, args.corrupt, args.target_text, "--corrupt")
        result = patch(model, clean, corrupt, point=args.point, by=args.by)
    else:
        inputs = _inputs(model, args.text, args.target_text)
        if analysis == "lens":
            result = logit_lens(model, inputs)
        elif analysis == "decompose":
            result = decompose(model, inputs)
        elif analysis == "rollout":
            result = attention_rollout(model, inputs)
        else:
            target = _target_id(model, inputs, args.target)
            target_label = model.tokenizer.labels([target])[0] if getattr(model, "tokenizer", None) else str(target)
            if analysis == "dla":
                result = direct_logit_attribution(model, inputs, target)
            elif analysis == "ig":
                result = integrated_gradients(model, inputs, target, steps=args.steps)
            else:
                result = gradient_x_input(model, inputs, target)
    return result, target_label


def _about(args: argparse.Namespace, target: str | None, baseline: str | None = None) -> str:
    """What was analysed, in words, for the terminal and the page's title: the model, the text and
    (for an attribution) the token whose logit is explained."""
    if args.analysis == "heads":
        return f"{args.model}, {args.kind.replace('_', '-')} heads on repeated random tokens"
    if args.analysis == "patch":
        return (f"{args.model}, “{args.corrupt}” with “{args.clean}”'s {args.point} put back, one "
                f"{args.by} at a time; the log-probability of the clean run's top token")
    text = f"{args.model}, “{args.text}”" + (f" → “{args.target_text}”" if args.target_text else "")
    return text + (f", the logit of '{target}'" if target is not None else "") + (baseline or "")


def _summary(result) -> str:
    """The numbers a reader looks at first, folded to 80 columns, with the tokens' legend when a
    token shown has a space or a new line."""
    from ..checkpoints.token_text import legend_for

    text = _first_numbers(result)
    legend = legend_for(result.tokens[0] if result.tokens else []) if "'" in text else None
    lines = textwrap.wrap(text, 80, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines + (textwrap.wrap(f"(tokens: {legend})", 80) if legend else []))


def _first_numbers(result) -> str:
    values = result.values
    if result.axes == ("layer", "head"):
        layer, head = divmod(int(values.argmax()), values.size(1))
        return f"strongest: L{layer}H{head} = {values.max().item():.3f}"
    if result.kind in ("integrated gradients", "gradient x input"):
        tokens = result.tokens[0]
        order = values[0].abs().argsort(descending=True)[:5].tolist()
        return "largest: " + ", ".join(f"'{tokens[i]}' {values[0, i].item():+.3f}" for i in order)
    if result.kind == "logit lens":
        top = result.extra["top_tokens"]
        return "top token after each layer, last position: " + " → ".join(f"'{layer[0][-1][0]}'" for layer in top)
    if result.kind.endswith("patching") and values.dim() == 2:
        best = divmod(int(values.argmax()), values.size(1))
        where = f"layer {best[0]}, '{result.tokens[0][best[1]]}'" if result.axes[-1] == "pos" else f"L{best[0]}H{best[1]}"
        return f"the metric after patching: from {values.min().item():.4g} to {values.max().item():.4g} (highest at {where})"
    names = {"decomposition": "each component's write", "attention rollout": "the share of each token's flow",
             "direct logit attribution": "each component's share of the logit"}
    return f"{names.get(result.kind, 'values')}: from {values.min().item():.4g} to {values.max().item():.4g}"
