"""`anatomy generate`: write text with a trained or pretrained model, streamed as it is produced.

    anatomy generate --model runs/lm --prompt "Once upon a time" --max-new-tokens 64
    anatomy generate --model runs/lm --prompt "The" --strategy sample --temperature 0.8 --top-p 0.9 --seed 0
    anatomy generate --model runs/translator --src "ein kleines Haus" --num-beams 4

The directory holds a model (anatomy.from_pretrained) and its tokenizer (anatomy.load_tokenizer).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .generate import STRATEGIES, generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="a model directory: from `anatomy train`, or a Hugging Face checkpoint")
    parser.add_argument("--prompt", default="", help="the text to continue (decoder-only), or the decoder's "
                        "forced beginning (encoder-decoder)")
    parser.add_argument("--src", default=None, help="the source text, for an encoder-decoder model")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="at most this many new tokens (fewer if the model's max_seq_len is reached)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                        help="default: sample if a sampling option is given, beam if --num-beams > 1, else greedy")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (> 0; default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens")
    parser.add_argument("--top-p", type=float, default=None,
                        help="sample among the fewest most probable tokens holding probability >= p, in (0, 1]")
    parser.add_argument("--num-beams", type=int, default=1, help="beams for beam search")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search ranks by log p / length^this")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling (printed when not given)")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at every step")
    parser.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence token")


def load(path: str):
    """(model, tokenizer) from a model directory."""
    import anatomy

    return anatomy.from_pretrained(path), anatomy.load_tokenizer(path)


# anatomy's own special tokens first (training/tokenizers.py), then those of common checkpoints.
SPECIAL_TOKENS = {"bos": ("<SOS>", "<s>", "<|endoftext|>", "[CLS]"), "eos": ("<EOS>", "</s>", "<|endoftext|>", "[SEP]")}


def _special_id(model, tokenizer, role: str) -> int | None:
    """The id of the "bos" or "eos" token: anatomy's <SOS>/<EOS> if the vocabulary has it (the model
    was trained with it), else the model config's value (from config.json), else a conventional token name."""
    own = tokenizer.token_to_id(SPECIAL_TOKENS[role][0])
    if own is not None:
        return own
    names = ("decoder_start_token_id", "bos_token_id") if role == "bos" else ("eos_token_id",)
    for name in names:
        if getattr(model.config, name) is not None:
            return getattr(model.config, name)
    for token in SPECIAL_TOKENS[role][1:]:
        if tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token)
    return None


def _encode(tokenizer, text: str) -> list[int]:
    encoded = tokenizer.encode(text)
    return list(getattr(encoded, "ids", encoded))  # a tokenizers.Encoding, or already a list


class TextStreamer:
    """Prints the text of the tokens generated so far, as they come.

    Each step decodes every new token so far and prints what was not printed yet: a subword
    tokenizer may need several tokens for one character, and a word tokenizer puts spaces between
    words, so decoding tokens one by one would print the wrong text.
    """

    def __init__(self, tokenizer, out=sys.stdout):
        self.tokenizer, self.out = tokenizer, out
        self.ids: list[int] = []
        self.printed = ""

    def __call__(self, tokens: list[int]) -> None:
        self.ids.append(tokens[0])  # the CLI generates one row
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            return
        if text.startswith(self.printed):
            self.out.write(text[len(self.printed):])
            self.out.flush()
        self.printed = text


def run(args: argparse.Namespace) -> int:
    try:
        model, tokenizer = load(args.model)
    except (ValueError, OSError) as error:  # CheckpointError is a ValueError
        print(f"anatomy generate: {error}", file=sys.stderr)
        return 2
    config = model.config
    encoder_decoder = config.arch == "encoder-decoder"
    if config.arch == "encoder":
        print(f"anatomy generate: {args.model} is an encoder; generation needs a decoder or an encoder-decoder",
              file=sys.stderr)
        return 2
    eos, bos = _special_id(model, tokenizer, "eos"), _special_id(model, tokenizer, "bos")

    prompt = _encode(tokenizer, args.prompt) if args.prompt else []
    kwargs = {}
    if encoder_decoder:
        if args.src is None:
            print("anatomy generate: an encoder-decoder model needs --src TEXT", file=sys.stderr)
            return 2
        kwargs["src_ids"] = torch.tensor([_encode(tokenizer, args.src)])
        # The decoder was trained to read <SOS> y1 y2 ...: it starts from <SOS>.
        start = bos
        if start is None:
            print("anatomy generate: the tokenizer has no start-of-sequence token", file=sys.stderr)
            return 2
        prompt = [start] + prompt
    elif not prompt:
        # Nothing to continue: start from the end-of-sequence token, i.e. "after a finished text".
        start = eos if eos is not None else bos
        if start is None:
            print("anatomy generate: give --prompt TEXT (the tokenizer has no special token to start from)",
                  file=sys.stderr)
            return 2
        prompt = [start]

    max_new_tokens = args.max_new_tokens
    limit = (model.decoder if encoder_decoder else model).max_positions  # None: no position table
    if limit is not None and len(prompt) + max_new_tokens > limit:
        max_new_tokens = limit - len(prompt)
        if max_new_tokens < 1:
            print(f"anatomy generate: the prompt has {len(prompt)} tokens; the model's max_seq_len is {limit}",
                  file=sys.stderr)
            return 2
        print(f"[max-new-tokens lowered to {max_new_tokens}: the model's max_seq_len is {limit}]", file=sys.stderr)

    sampling = {name: value for name, value in
                (("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                 ("seed", args.seed)) if value is not None}
    strategy = args.strategy or ("sample" if sampling else "beam" if args.num_beams > 1 else "greedy")
    if strategy == "sample":
        kwargs.update(sampling)
    elif sampling:
        print(f"anatomy generate: {', '.join('--' + n.replace('_', '-') for n in sampling)} only apply to "
              f"--strategy sample", file=sys.stderr)
        return 2
    streamer = TextStreamer(tokenizer) if strategy != "beam" else None

    if not encoder_decoder:
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
    began = time.perf_counter()
    try:
        out = generate(
            model, torch.tensor([prompt]), strategy=strategy, max_new_tokens=max_new_tokens,
            num_beams=args.num_beams, length_penalty=args.length_penalty if strategy == "beam" else 1.0,
            stop_tokens=None if args.no_stop or eos is None else [eos], use_cache=not args.no_cache,
            streamer=streamer, **kwargs,
        )
    except ValueError as error:
        print(f"\nanatomy generate: {error}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - began
    n_new = int(out.padding_mask[0, out.prompt_length:].sum())
    if streamer is None:
        sys.stdout.write(tokenizer.decode(out.new_tokens[0, :n_new].tolist()))
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text first, then the summary on stderr
    seed = f", seed {out.seed}" if out.seed is not None else ""
    print(f"[{n_new} tokens in {seconds:.2f} s, {n_new / seconds:.1f} tokens/s; {strategy}{seed}; "
          f"cache {'off' if args.no_cache else 'on'}]", file=sys.stderr)
    return 0
