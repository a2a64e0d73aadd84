"""`anatomy walk`: narrate one forward pass, step by step, with the real numbers.

    anatomy walk                                  seed 004's sentence on the toy decoder
    anatomy walk "Hello World" --layer 1 --head 1
    anatomy walk --model toy-seq2seq              encoder-decoder: rectangular cross-attention
    anatomy walk --model minilm --format html --out walk.html
    anatomy walk "some text" --model path/to/hf-checkpoint

Exit status: 0 when every step's recomputation matched the model, 1 when one did not, 2 for a
usage error (an unknown model, a layer or head out of range).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .steps import walkthrough
from ..checkpoints.toys import SENTENCE, TRANSLATION, seq2seq_vocab, toy_model
from ..checkpoints.toys import article_words as seed004_words, sentence_vocab as seed004_vocab

TOY_MODELS = ("toy", "toy-encoder", "toy-seq2seq")
MODELS = TOY_MODELS + ("minilm",)
FORMATS = ("terminal", "markdown", "html")
DEFAULT_TEXT = {"minilm": "Time flies like an arrow"}  # the seeds' bertviz example


class WalkError(Exception):
    """A problem with the command's arguments, explained for the user."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", default=None,
                        help=f"the input text (default: {SENTENCE!r}; for minilm: {DEFAULT_TEXT['minilm']!r})")
    parser.add_argument("--model", default="toy", metavar="|".join(MODELS) + "|PATH",
                        help="toy (seed 004's decoder, the default), toy-encoder, toy-seq2seq, minilm "
                             "(the pretrained all-MiniLM-L6-v2), or a Hugging Face-format directory")
    parser.add_argument("--target", default=None,
                        help=f"toy-seq2seq: the decoder's text (default: {TRANSLATION!r})")
    parser.add_argument("--layer", type=int, default=0, help="the layer narrated in full (default 0)")
    parser.add_argument("--head", type=int, default=0, help="the attention head narrated in full (default 0)")
    parser.add_argument("--norm-position", choices=("pre", "post"), default=None,
                        help="toy models: pre-norm (GPT-2) or post-norm (the paper, the default)")
    parser.add_argument("--seed", type=int, default=0, help="toy models: the seed of their weights (default 0)")
    parser.add_argument("--format", choices=FORMATS, default="terminal", help="terminal (default), markdown or html")
    parser.add_argument("--out", default=None, metavar="FILE", help="write to FILE instead of the terminal")


def _encode(tokenizer, text: str, *, special: bool) -> tuple[list[int], list[str], object]:
    """(ids, tokens, id -> token) from an anatomy, `tokenizers` or transformers tokenizer."""
    if hasattr(tokenizer, "id_to_token") and hasattr(tokenizer, "bos_id"):  # anatomy's Tokenizer
        ids = tokenizer.encode(text, add_bos=special, add_eos=special)
        label = tokenizer.id_to_token
    elif hasattr(tokenizer, "id_to_token"):  # a tokenizers.Tokenizer
        ids = tokenizer.encode(text, add_special_tokens=special).ids
        label = tokenizer.id_to_token
    elif callable(tokenizer):  # a transformers tokenizer
        ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        label = lambda i: tokenizer.convert_ids_to_tokens(int(i))  # noqa: E731
    else:
        raise WalkError(f"cannot tokenize with a {type(tokenizer).__name__}")
    return list(ids), [str(label(i)) for i in ids], label


def _load_pretrained(name: str):
    try:
        from ..checkpoints import from_pretrained, load_tokenizer
    except ImportError as error:
        raise WalkError(f"--model {name} needs anatomy.checkpoints, which is not available here ({error})")
    try:
        return from_pretrained(name), load_tokenizer(name)
    except Exception as error:  # noqa: BLE001 - the loader's own message says what is wrong
        raise WalkError(f"could not load {name!r}: {error}") from error


def build(args: argparse.Namespace):
    """The walkthrough the arguments ask for."""
    name = args.model
    toy = name in TOY_MODELS
    if not toy and name != "minilm" and not Path(name).is_dir():
        raise WalkError(f"unknown --model {name!r}; choose one of {', '.join(MODELS)}, "
                        "or give the path of a Hugging Face-format directory")
    if not toy and (args.norm_position or args.target):
        raise WalkError("--norm-position and --target apply to the toy models only")
    overrides = {"norm_position": args.norm_position} if args.norm_position else {}
    if overrides.get("norm_position") == "pre":
        overrides["final_norm"] = True
    text = args.text if args.text is not None else DEFAULT_TEXT.get(name, SENTENCE)
    options = {"layer": args.layer, "head": args.head, "model_name": name}
    if name == "toy-seq2seq":
        target = args.target if args.target is not None else TRANSLATION
        vocab = seq2seq_vocab(text, target)
        source_words, target_words = seed004_words(text), seed004_words(target, eos=False)
        model = toy_model(len(vocab), arch="encoder-decoder", seed=args.seed, **overrides)
        return model, vocab.encode(source_words), dict(
            options, tokens=source_words, vocab=list(vocab.itos),
            target_ids=vocab.encode(target_words), target_tokens=target_words)
    if toy:
        vocab = seed004_vocab(text)
        words = seed004_words(text)
        arch = "encoder" if name == "toy-encoder" else "decoder"
        model = toy_model(len(vocab), arch=arch, seed=args.seed, **overrides)
        return model, vocab.encode(words), dict(options, tokens=words, vocab=list(vocab.itos))
    model, tokenizer = _load_pretrained(name)
    if model.config.arch == "encoder-decoder":
        raise WalkError(f"{name!r} is an encoder-decoder; the walk of a pretrained one needs a target text, "
                        "which is not supported yet: try --model toy-seq2seq")
    ids, tokens, label = _encode(tokenizer, text, special=model.config.arch == "encoder")
    return model, ids, dict(options, tokens=tokens, vocab=label)


def _check_range(value: int, count: int, what: str) -> None:
    if not 0 <= value < count:
        raise WalkError(f"--{what} {value} is out of range: this model has {count} {what}s, choose 0 … {count - 1}")


def run(args: argparse.Namespace) -> int:
    try:
        model, ids, options = build(args)
        _check_range(args.layer, model.config.n_layers, "layer")
        _check_range(args.head, model.config.n_heads, "head")
        walk = walkthrough(model, ids, **options)
    except (WalkError, KeyError) as error:
        print(f"anatomy walk: error: {error}", file=sys.stderr)
        return 2
    if args.format == "markdown":
        output = walk.to_markdown()
    elif args.format == "html":
        output = walk.to_html()
    else:
        output = None
    if args.out:
        Path(args.out).write_text(output if output is not None else walk.to_text(), encoding="utf-8")
        print(f"anatomy walk: wrote {len(walk.steps)} steps to {args.out}", file=sys.stderr)
    elif output is not None:
        sys.stdout.write(output)
    else:
        walk.print()
    if not walk.ok:
        failed = ", ".join(f"{s.number} ({s.title})" for s in walk.failures)
        print(f"anatomy walk: the model's tensors and the recomputation disagree at step {failed}", file=sys.stderr)
        return 1
    return 0
