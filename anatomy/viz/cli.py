"""`anatomy viz`: run a model on a text, trace its attention, write a view (HTML) and/or an image.

    anatomy viz "Hello World, this is Alejandro!" --view head --out heads.html
    anatomy viz "time flies like an arrow" "fruit flies like a banana" --model minilm --view model --out model.html
    anatomy viz "Hello World, this is Alejandro!" "Hola Mundo, soy Alejandro!" --model toy-seq2seq --out pair.html
    anatomy viz "Hello World, this" --view generation --out generation.html --png step.png

--model takes what every command takes (anatomy.from_pretrained). TEXT_B is a sentence pair for an
encoder (BERT's segments A and B), or the target for an encoder-decoder (without it, the model's
own greedy translation, and the command says so); a decoder takes one text.
A text longer than the model's positions is cut, and the command says so.
"""

from __future__ import annotations

import argparse
import sys

from ..arguments import add_compute_arguments, add_model_argument, non_negative_int, output_file, positive_int, text
from ..progress import Stages
from ..terminal import printable

# The model, the views and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.

VIEWS = ("head", "model", "neuron", "generation")
MAX_VIEW_TOKENS = 1024  # the generation view of a model without a position table: at most this many tokens
NEW_TOKENS = 8  # the generation view's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT", type=text, help="the text to run the model on")
    parser.add_argument("text_b", metavar="TEXT_B", type=text, nargs="?",
                        help="a second sentence (a pair, for an encoder), or the target of an encoder-decoder "
                        "(default: the model's own greedy translation)")
    add_model_argument(parser)
    add_compute_arguments(parser)
    parser.add_argument("--view", choices=VIEWS, default="head", help="which view to write (default: head)")
    parser.add_argument("--out", metavar="FILE.html", type=output_file(".html"),
                        help="write the interactive view here (one self-contained file)")
    parser.add_argument("--png", metavar="FILE.png", type=output_file(".png"),
                        help="write the heatmap of --layer/--head as a PNG")
    parser.add_argument("--svg", metavar="FILE.svg", type=output_file(".svg"),
                        help="write the heatmap of --layer/--head as an SVG")
    parser.add_argument("--layer", type=non_negative_int, default=0,
                        help="layer to open first and to draw in images")
    parser.add_argument("--head", type=non_negative_int, default=None,
                        help="model and neuron views: the head to open first; images: the head drawn (default: 0)")
    parser.add_argument("--query", type=non_negative_int, default=None,
                        help="neuron view: the query position to open first (default: 0)")
    parser.add_argument("--new-tokens", type=positive_int, default=None,
                        help=f"generation view: tokens to generate (default: {NEW_TOKENS}; prompt and new tokens must "
                        "fit the model's positions)")


def check_arguments(args: argparse.Namespace) -> None:
    """Every option against the view and the model's config, before the model loads: an option the
    view would ignore is refused, and so is a layer or head the model does not have."""
    if not (args.out or args.png or args.svg):
        raise ValueError("nothing to write; give --out FILE.html and/or --png FILE.png / --svg FILE.svg")
    if args.head is not None and args.view in ("head", "generation") and not (args.png or args.svg):
        raise ValueError(f"the {args.view} view shows every head: --head picks the head of --view model or neuron, "
                         "and of --png/--svg")
    if args.query is not None and args.view != "neuron":
        raise ValueError("--query is for --view neuron")
    if args.new_tokens is not None and args.view != "generation":
        raise ValueError("--new-tokens is for --view generation")
    from ..checkpoints.describe import config_of

    config = config_of(args.model)
    if config is None:  # a Hub id not downloaded yet: the views check the traced maps
        return
    for option, value, size in (("layer", args.layer, config.n_layers), ("head", args.head, config.n_heads)):
        if value is not None and value >= size:
            raise ValueError(f"--{option} {value} is out of range: {args.model} has {size} {option}s, "
                             f"choose 0 … {size - 1}")
    if args.view == "generation":
        if config.arch != "decoder":
            raise ValueError(f"the generation view needs a decoder; --model {args.model} is an {config.arch}")
        if args.text_b is not None:
            raise ValueError("the generation view takes one prompt TEXT, not a pair")
        limit = config.max_seq_len if config.pos_encoding in ("learned", "sinusoidal", "rotary") else MAX_VIEW_TOKENS
        if (args.new_tokens or NEW_TOKENS) >= limit:
            raise ValueError(f"--new-tokens {args.new_tokens or NEW_TOKENS}: one pass of --model {args.model} holds "
                             f"{limit} positions, for the prompt and the new tokens together")
    elif args.text_b is not None and config.arch == "decoder":
        raise ValueError(f"--model {args.model} is a decoder, which reads one text: TEXT_B (a sentence pair) needs an "
                         "encoder (e.g. --model toy-encoder or minilm), a translation target an encoder-decoder "
                         "(--model toy-seq2seq)")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    from ..checkpoints import from_pretrained, load_tokenizer

    args.head, args.query = args.head or 0, args.query or 0
    args.new_tokens = args.new_tokens or NEW_TOKENS
    with Stages.of(args) as stages:
        stages.start("loading the model")
        model = from_pretrained(args.model, device=args.device)
        tokenizer = getattr(model, "tokenizer", None) or load_tokenizer(args.model)
        stages.start("tracing the attention")
        maps, prompt_length = trace_attention(args, model, tokenizer)
        stages.start("drawing")
        try:
            written = write_outputs(args, maps, prompt_length)
        except IndexError as error:  # a --layer, --head or --query past the model's: the message names the range
            raise ValueError(str(error)) from None
    for path in written:
        print(f"wrote {printable(path)}")
    return 0


def trace_attention(args, model, tokenizer):
    """(AttentionMaps, prompt length or None) for the model, the text(s) and the view."""
    if args.view == "generation":
        return generation_attention(args, model, tokenizer)
    if args.text_b is not None and model.config.arch == "decoder":
        raise ValueError(f"--model {args.model} is a decoder, which reads one text: TEXT_B (a sentence pair) needs an "
                         "encoder (e.g. --model toy-encoder or minilm), a translation target an encoder-decoder "
                         "(--model toy-seq2seq)")
    from .adapters import attention_from_model

    notes: list[str] = []
    maps = attention_from_model(model, tokenizer, args.text, args.text_b, notes=notes)
    for note in notes:  # a text longer than the model's positions was cut; a target translated
        print(f"[{printable(note)}]", file=sys.stderr)
    return maps, None


def generation_attention(args, model, tokenizer):
    """The causal attention of the prompt and its greedy continuation, in one pass."""
    from .adapters import attention_from_ids, greedy_continuation, tokens_of

    if model.config.arch != "decoder":
        raise ValueError(f"the generation view needs a decoder; --model {args.model} is an {model.config.arch}")
    if args.text_b is not None:
        raise ValueError("the generation view takes one prompt TEXT, not a pair")
    prompt = tokenizer.encode_prompt(args.text)
    ids = greedy_continuation(model, prompt, args.new_tokens, limit=MAX_VIEW_TOKENS)
    return attention_from_ids(model, ids, tokens_of(tokenizer, ids)), len(prompt)


def write_outputs(args, maps, prompt_length) -> list[str]:
    """Build every output that was asked for, then write them (so a bad --layer writes nothing)."""
    from . import views
    from .plots import map_heatmap, save_figure

    figures = {path: map_heatmap(maps[0], args.layer, args.head) for path in (args.png, args.svg) if path}
    view = None
    if args.out:
        second = f" / “{args.text_b}”" if args.text_b else ""
        if args.text_b is None and any(m.cross for m in maps):  # an encoder-decoder's own translation
            second = " / its own translation"
        title = f"“{args.text}”{second} · {args.model}"
        if args.view == "head":
            view = views.head_view(maps, layer=args.layer, title=f"Attention heads · {title}")
        elif args.view == "model":
            view = views.model_view(maps, layer=args.layer, head=args.head, title=f"Every layer and head · {title}")
        elif args.view == "neuron":
            view = views.neuron_view(maps, layer=args.layer, head=args.head, query=args.query,
                                     title=f"Inside one head · {title}")
        else:
            view = views.generation_view(maps[0], prompt_length=prompt_length, layer=args.layer,
                                         title=f"Attention while generating · {title}")
    written = [str(save_figure(figure, path)) for path, figure in figures.items()]
    if view is not None:
        written.append(str(view.save(args.out)))
    return written
