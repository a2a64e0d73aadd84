"""`anatomy viz`: run a model on a text, trace its attention, write a view (HTML) and/or an image.

    anatomy viz "Hello World, this is Alejandro!" --view head --out heads.html
    anatomy viz "time flies like an arrow" "fruit flies like a banana" --model minilm --view model --out model.html
    anatomy viz "Hello World, this is Alejandro!" --view generation --out generation.html --png step.png

--model toy: seed 004's seeded toy (a decoder; with TEXT_B, an encoder-decoder translating TEXT to
TEXT_B), its vocabulary the words of the text. --model minilm or a checkpoint directory: the real
model and its tokenizer, through anatomy.from_pretrained and anatomy.load_tokenizer.
"""

from __future__ import annotations

import argparse
import sys

VIEWS = ("head", "model", "neuron", "generation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT", help="the text to run the model on")
    parser.add_argument("text_b", metavar="TEXT_B", nargs="?",
                        help="a second sentence (a sentence pair), or the target of an encoder-decoder")
    parser.add_argument("--model", default="toy", help="toy (default), minilm, or a checkpoint directory")
    parser.add_argument("--view", choices=VIEWS, default="head", help="which view to write (default: head)")
    parser.add_argument("--out", metavar="FILE.html", help="write the interactive view here (one self-contained file)")
    parser.add_argument("--png", metavar="FILE.png", help="write the heatmap of --layer/--head as a PNG")
    parser.add_argument("--svg", metavar="FILE.svg", help="write the heatmap of --layer/--head as an SVG")
    parser.add_argument("--layer", type=int, default=0, help="layer to open first and to draw in images (default 0)")
    parser.add_argument("--head", type=int, default=0, help="head to open first and to draw in images (default 0)")
    parser.add_argument("--query", type=int, default=0, help="neuron view: the query position to open first (default 0)")
    parser.add_argument("--new-tokens", type=int, default=8, help="generation view: tokens to generate (default 8)")


def run(args: argparse.Namespace) -> int:
    if not (args.out or args.png or args.svg):
        print("anatomy viz: nothing to write; give --out FILE.html and/or --png FILE.png / --svg FILE.svg", file=sys.stderr)
        return 2
    try:
        maps, prompt_length = trace_attention(args)
        written = write_outputs(args, maps, prompt_length)
    except (ValueError, IndexError, KeyError) as error:
        print(f"anatomy viz: {error.args[0] if error.args else error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def trace_attention(args):
    """(AttentionMaps, prompt length) for the requested model, text and view."""
    from anatomy.viz import adapters

    if args.model == "toy":
        return toy_attention(args)
    import anatomy

    model = anatomy.from_pretrained(args.model)
    tokenizer = anatomy.load_tokenizer(args.model)
    if args.view != "generation":
        return adapters.attention_from_model(model, tokenizer, args.text, args.text_b), None
    if model.config.arch != "decoder":
        raise ValueError(f"the generation view needs a decoder model; {args.model} is an {model.config.arch}")
    ids, _, _ = adapters.encode(tokenizer, args.text)
    ids = adapters.greedy_continuation(model, ids, args.new_tokens)
    tokens = [adapters.token_text(tokenizer, i) for i in ids]
    return adapters.attention_from_ids(model, ids, tokens), len(ids) - args.new_tokens


def toy_attention(args):
    """Seed 004's toy: a decoder on TEXT, or an encoder-decoder from TEXT to TEXT_B."""
    from anatomy.viz import adapters
    from anatomy.checkpoints.toys import article_words as seed004_words, sentence_vocab as seed004_vocab, seq2seq_vocab, toy_model

    if args.text_b is not None:
        if args.view == "generation":
            raise ValueError("the generation view takes one prompt TEXT, not a pair")
        vocab = seq2seq_vocab(args.text, args.text_b)
        source, target = seed004_words(args.text), seed004_words(args.text_b, eos=False)
        model = toy_model(len(vocab), arch="encoder-decoder", max_seq_len=max(16, len(source), len(target)))
        return adapters.seq2seq_attention(model, vocab.encode(source), source, vocab.encode(target), target), None
    vocab = seed004_vocab(args.text)
    if args.view != "generation":
        words = seed004_words(args.text)
        model = toy_model(len(vocab), max_seq_len=max(16, len(words)))
        return adapters.attention_from_ids(model, vocab.encode(words), words), None
    prompt = seed004_words(args.text, eos=False)
    model = toy_model(len(vocab), max_seq_len=max(16, len(prompt) + args.new_tokens))
    ids = adapters.greedy_continuation(model, vocab.encode(prompt), args.new_tokens)
    return adapters.attention_from_ids(model, ids, vocab.decode(ids)), len(prompt)


def write_outputs(args, maps, prompt_length) -> list[str]:
    """Write the HTML view and the images that were asked for; return their paths."""
    from anatomy.viz import views

    written = []
    if args.png or args.svg:
        from anatomy.viz.plots import map_heatmap, save_figure

        for path in (args.png, args.svg):
            if path:
                written.append(str(save_figure(map_heatmap(maps[0], args.layer, args.head), path)))
    if args.out:
        title = f"“{args.text}”" + (f" / “{args.text_b}”" if args.text_b else "") + f" · {args.model}"
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
        written.append(str(view.save(args.out)))
    return written
