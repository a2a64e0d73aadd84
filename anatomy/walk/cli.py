"""`anatomy walk`: narrate one forward pass, step by step, with the real numbers.

    anatomy walk                                  the article's sentence on the trained toy decoder
    anatomy walk "Hello World" --layer 1 --head 1
    anatomy walk --model toy-seq2seq              encoder-decoder: rectangular cross-attention
    anatomy walk --model minilm --format html --out walk.html
    anatomy walk "some text" --model path/to/checkpoint
    anatomy walk --list-examples                  the source texts' own worked examples
    anatomy walk --example armas                  one of them, with its printed numbers

Exit status: 0 when every step's recomputation matched, 1 when one did not, 2 for a usage error
(an unknown model, a layer or head out of range, a text longer than the model's context).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap

from ..arguments import add_compute_arguments, add_model_argument, non_negative_int, output_file, seed, text
from ..progress import Stages
from ..terminal import printable
from .sources import EXAMPLES

# The model, the walk and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.

FORMATS = ("terminal", "markdown", "html")
DEFAULT_TEXT = {"minilm": "Time flies like an arrow"}  # the bertviz example of the "3 Transformer Anatomy" notes
# A toy's position table (sinusoids, a formula) grows to fit a text, up to this many tokens: every
# step prints [T, T] matrices, and a walk of 17 000 tokens would take gigabytes to say nothing readable.
MAX_TOY_TOKENS = 1024


class WalkError(ValueError):
    """A problem with the command's arguments, explained for the user."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", default=None, type=text,
                        help="the input text (default: the model's own example; for minilm: "
                             f"{DEFAULT_TEXT['minilm']!r})")
    add_model_argument(parser, default="toy", help="the model whose forward pass is narrated")
    add_compute_arguments(parser)
    parser.add_argument("--target", default=None, type=text, help="an encoder-decoder: the decoder's text")
    parser.add_argument("--layer", type=non_negative_int, default=0, help="the layer narrated in full")
    parser.add_argument("--head", type=non_negative_int, default=0, help="the attention head narrated in full")
    parser.add_argument("--norm-position", choices=("pre", "post"), default=None,
                        help="toy models: pre-norm (GPT-2) or post-norm (the paper, the default); refitted")
    parser.add_argument("--seed", type=seed, default=0, help="toy models: the seed of their fitting")
    parser.add_argument("--format", choices=FORMATS, default="terminal", help="terminal, markdown or html")
    parser.add_argument("--out", default=None, metavar="FILE", type=output_file(),
                        help="write to FILE instead of the terminal")
    parser.add_argument("--list-examples", action="store_true",
                        help="list the source texts' worked examples (each a name, then its description, indented)")
    parser.add_argument("--example", default=None, metavar="NAME", choices=sorted(EXAMPLES),
                        help="walk one source text's worked example, with its own numbers")


def _toy(args: argparse.Namespace, stages: Stages) -> tuple:
    """(model, ids, walkthrough options) for a built-in toy, grown to fit a long text; every
    argument is checked before the toy is built."""
    from ..checkpoints.describe import config_of
    from ..checkpoints.toys import TOYS, build_toy, toy_tokenizer
    from .walkthrough import check_layer_and_head

    name, toy = args.model, TOYS[args.model]
    overrides = {}
    if args.norm_position:
        overrides = {"norm_position": args.norm_position, "final_norm": args.norm_position == "pre"}
    check_layer_and_head(config_of(name), args.layer, args.head)
    tokenizer = toy_tokenizer(name)
    text = args.text if args.text is not None else toy.text
    if toy.arch != "encoder-decoder" and args.target is not None:
        raise WalkError(f"--target is for an encoder-decoder; {name} is {_a(toy.arch)}")
    # as the toy reads them: a decoder's prompt ends where the text ends (no <EOS>: it predicts what follows)
    ids, target_ids = tokenizer.encode_for(config_of(name), text, args.target if args.target is not None else toy.target)
    longest = max(len(ids), len(target_ids or []))
    if longest > MAX_TOY_TOKENS:
        raise WalkError(f"the text is {longest} tokens long; a toy's walk reads at most {MAX_TOY_TOKENS}")
    stages.start("fitting the toy")
    model = build_toy(name, seed=args.seed, max_seq_len=longest, **overrides).to(args.device)
    return model, ids, target_ids, tokenizer, toy.task


def _pretrained(args: argparse.Namespace, stages: Stages) -> tuple:
    """(model, ids, target ids, tokenizer) for any name or path the resolver knows. The config and
    the tokenizer come first, so that every argument is checked before a weight loads."""
    from ..checkpoints import from_pretrained, load_tokenizer
    from ..checkpoints.describe import config_of
    from .walkthrough import check_layer_and_head

    if args.norm_position:
        raise WalkError("--norm-position applies to the toy models only")
    config = config_of(args.model)  # None: a Hub id not downloaded yet, checked once it is
    if config is not None:
        check_layer_and_head(config, args.layer, args.head)
        if config.arch != "encoder-decoder" and args.target is not None:
            raise WalkError(f"--target is for an encoder-decoder; {args.model} is {_a(config.arch)}")
        if config.arch == "encoder-decoder" and args.target is None:
            raise WalkError(f"{args.model} is an encoder-decoder: give the decoder's text with --target")
    tokenizer = load_tokenizer(args.model)
    text = args.text if args.text is not None else DEFAULT_TEXT.get(args.model, "Hello World, this is Alejandro!")
    ids = tokenizer.encode_prompt(text) if config is not None and config.arch == "decoder" else tokenizer.encode(text)
    if config is not None:
        _check_length(args, config, ids, tokenizer)
    stages.start("loading the model")
    model = from_pretrained(args.model, device=args.device, tokenizer=False)
    if config is None:  # now it is known
        check_layer_and_head(model.config, args.layer, args.head)
    if model.config.arch == "decoder":
        ids = tokenizer.encode_prompt(text)  # a prompt: no closing EOS
    target_ids = _check_length(args, model.config, ids, tokenizer)
    return model, ids, target_ids, tokenizer, None


def _a(arch: str) -> str:
    return f"an {arch}" if arch.startswith("encoder") else f"a {arch}"


def _check_length(args: argparse.Namespace, config, ids: list[int], tokenizer) -> list[int] | None:
    """The target's ids (an encoder-decoder), after checking that the text and the target fit the
    model's positions; WalkError otherwise."""
    target_ids = None
    if config.arch == "encoder-decoder":
        if args.target is None:
            raise WalkError(f"{args.model} is an encoder-decoder: give the decoder's text with --target")
        target_ids = tokenizer.encode_target(args.target, config.decoder_start_token_id)
    elif args.target is not None:
        raise WalkError(f"--target is for an encoder-decoder; {args.model} is {_a(config.arch)}")
    limit = config.max_seq_len if config.pos_encoding in ("learned", "sinusoidal", "rotary") else None
    longest = max(len(ids), len(target_ids or []))
    if limit is not None and longest > limit:
        raise WalkError(f"the text is {longest} tokens long; {args.model} reads at most {limit} (its max_seq_len)")
    return target_ids


def build(args: argparse.Namespace, stages: Stages):
    """The Walkthrough the arguments ask for, its stages said as they start."""
    from ..checkpoints.toys import MASK, TOY_MODELS
    from .walkthrough import walkthrough

    model, ids, target_ids, tokenizer, task = (_toy if args.model in TOY_MODELS else _pretrained)(args, stages)
    if not ids:
        raise WalkError("the text has no tokens")
    label = lambda i: tokenizer.labels([i])[0]  # noqa: E731  each token as text ("␣capital"), as everywhere
    options = dict(layer=args.layer, head=args.head, model_name=args.model, task=task,
                   tokens=tokenizer.labels(ids), vocab=label)
    if target_ids is not None:
        options.update(target_ids=target_ids, target_tokens=tokenizer.labels(target_ids))
    if model.config.arch == "encoder":
        options["mask_token"] = MASK if args.model in TOY_MODELS else tokenizer.mask_token
    stages.start("the walk")
    try:
        walk = walkthrough(model, ids, **options)
    except ValueError as error:  # a layer or head out of range
        raise WalkError(str(error)) from None
    unknown = getattr(tokenizer, "special_ids", {}).get("unk")
    if args.model in TOY_MODELS and unknown in ids + (target_ids or []):
        walk.notes.append(f"The toy knows only the words of its task; the other words of the text became "
                          f"{label(unknown)}.")
    return walk


def list_examples(width: int = 80) -> str:
    """One paragraph per worked example, its name first, wrapped to `width` columns."""
    indent = max(map(len, EXAMPLES)) + 2
    return "\n".join(textwrap.fill(example.description, min(width, 80), initial_indent=f"{name:<{indent}}",
                                    subsequent_indent=" " * indent) for name, example in EXAMPLES.items())


def run(args: argparse.Namespace) -> int:
    from ..viz import write_atomically
    from .examples import example_walk

    if args.list_examples:
        print(list_examples(shutil.get_terminal_size().columns))
        return 0
    if args.example and (args.text is not None or args.target is not None or args.model != "toy"):
        raise WalkError("--example walks a source text's own model and numbers: it takes no TEXT, --model or --target")
    # stdout is the walk itself, stderr its notes and errors: stages once the checks are done, as lines if asked
    with Stages.of(args, sys.stderr, redirected=False) as stages:
        walk = example_walk(args.example) if args.example else build(args, stages)
    if args.format == "markdown":
        output = walk.to_markdown()
    elif args.format == "html":
        output = walk.to_html()
    else:
        output = None
    if args.out:
        write_atomically(args.out, output if output is not None else walk.to_text())
        print(f"anatomy walk: wrote {len(walk.steps)} steps to {printable(args.out)}", file=sys.stderr)
    elif output is not None:
        sys.stdout.write(output)
    else:
        walk.print()
    if not walk.ok:
        failed = ", ".join(f"{s.number} ({s.title})" for s in walk.failures)
        print(f"anatomy walk: the recomputation and the model disagree at step {failed}", file=sys.stderr)
        return 1
    return 0
