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

import torch

from ..checkpoints import from_pretrained
from ..cli import add_model_argument, positive_int
from .attribution import attention_rollout, gradient_x_input, integrated_gradients
from .decompose import decompose, direct_logit_attribution
from .heads import KINDS, detect_heads
from .lens import logit_lens
from .patching import BY, patch

ANALYSES = ("lens", "decompose", "dla", "patch", "ig", "gxi", "rollout", "heads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("analysis", choices=ANALYSES, help="which analysis: " + ", ".join(ANALYSES))
    parser.add_argument("text", nargs="?", help="the input text (the source, for an encoder-decoder)")
    add_model_argument(parser)
    parser.add_argument("--target-text", help="encoder-decoder: the decoder's input text")
    parser.add_argument("--target", help="ig, gxi, dla: the token whose logit is explained (default: the top prediction)")
    parser.add_argument("--clean", help="patch: the clean text")
    parser.add_argument("--corrupt", help="patch: the corrupted text (same number of tokens)")
    parser.add_argument("--point", default="resid_pre", help="patch: the point in each block (default resid_pre)")
    parser.add_argument("--by", choices=BY, default="position", help="patch: one cell per position, head or layer")
    parser.add_argument("--kind", choices=KINDS, default="induction", help="heads: which kind to score")
    parser.add_argument("--steps", type=positive_int, default=50, help="ig: Gauss-Legendre steps (default 50)")
    parser.add_argument("--out", help="write the view: .html (interactive, offline), .png or .svg")


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
    if target is None:
        return int(logit_lens(model, inputs).extra["top_ids"][-1, 0, -1, 0])
    tokenizer = model.tokenizer
    ids = tokenizer.encode(target, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"--target {target!r} is {len(ids)} tokens for this tokenizer; give text that is one token")
    return ids[0]


def run(args: argparse.Namespace) -> int:
    model = from_pretrained(args.model).eval()
    torch.manual_seed(0)
    analysis = args.analysis
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
            if analysis == "dla":
                result = direct_logit_attribution(model, inputs, target)
            elif analysis == "ig":
                result = integrated_gradients(model, inputs, target, steps=args.steps)
            else:
                result = gradient_x_input(model, inputs, target)
    shape = ", ".join(f"{axis} {size}" for axis, size in zip(result.axes, result.values.shape))
    print(f"{result.kind} [{shape}]")
    print(f"check: {result.check}")
    print(_summary(result))
    if args.out:
        print(f"wrote {result.save(args.out)}")
    return 0


def _summary(result) -> str:
    """One line of the numbers a reader looks at first."""
    values = result.values
    if result.axes == ("layer", "head"):
        layer, head = divmod(int(values.argmax()), values.size(1))
        return f"strongest: L{layer}H{head} = {values.max().item():.3f}"
    if result.kind in ("integrated gradients", "gradient x input"):
        tokens = result.tokens[0]
        order = values[0].abs().argsort(descending=True)[:5].tolist()
        return "largest: " + ", ".join(f"{tokens[i]!r} {values[0, i].item():+.3f}" for i in order)
    if result.kind == "logit lens":
        top = result.extra["top_tokens"]
        return "top token after each layer, last position: " + " → ".join(repr(layer[0][-1][0]) for layer in top)
    return f"min {values.min().item():.4g}, max {values.max().item():.4g}"
