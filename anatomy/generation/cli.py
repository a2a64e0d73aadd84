"""`anatomy generate`: write text with a trained or pretrained model, streamed as it is produced.

    anatomy generate                                          # the toy continues "Hello World, this"
    anatomy generate --prompt "What are"                      # the built-in toy decoder
    anatomy generate --model runs/lm --prompt "Once upon a time" --max-new-tokens 64
    anatomy generate --model runs/lm --prompt "The" --strategy sample --temperature 0.8 --top-p 0.9 --seed 0
    anatomy generate --model runs/translator --src "ein kleines Haus" --num-beams 4

--model takes what every command takes (anatomy.from_pretrained): a built-in name, a folder, a
.gguf file or a Hub id. Past the model's context the window slides (generate.py), and it says so.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..arguments import add_compute_arguments, add_model_argument, finite_float, positive_float, positive_int, seed, text, within
from ..progress import Stages
from ..terminal import one_line, printable
from .choices import MAX_LENGTH_PENALTY, STRATEGIES

# The model, the search and torch are imported by the functions that use them, once the arguments
# have been checked (anatomy.lazy): a mistake is refused in milliseconds.


KEEP = "\n\t"  # the control characters text may print as they are; any other is shown escaped
MAX_NEW_TOKENS = 2**20  # past the context the window slides, so only time bounds it: a million tokens is a book
MAX_BEAMS = 256  # beam search keeps this many sequences (and their caches) at every step
TOY_PROMPT_WORDS = 3  # with no --prompt, a toy decoder continues the first words of its own sentence


def top_p(value: str) -> float:
    """An argparse type: a probability in (0, 1]."""
    p = finite_float(value)
    if not 0.0 < p <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in (0, 1]")
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, help="a decoder or an encoder-decoder")
    add_compute_arguments(parser)
    parser.add_argument("--prompt", type=text, default=None, help="the text to continue (decoder-only), or the "
                        "decoder's forced beginning (encoder-decoder)")
    parser.add_argument("--src", type=text, default=None, help="the source text, for an encoder-decoder model")
    parser.add_argument("--chat", type=text, default=None, metavar="MESSAGE",
                        help="a chat model: send MESSAGE as the user, written in the checkpoint's own chat template, "
                             "and print only the answer (it stops at the template's end of turn)")
    parser.add_argument("--system", type=text, default=None, metavar="TEXT",
                        help="with --chat: the system message (default: the template's own, if it has one)")
    parser.add_argument("--max-new-tokens", type=within(positive_int, 1, MAX_NEW_TOKENS),
                        default=64, metavar="N",
                        help="at most this many new tokens; past the model's context the window slides")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                        help="default: sample if a sampling option is given, beam if --num-beams > 1, else greedy")
    parser.add_argument("--temperature", type=positive_float, default=None,
                        help="sampling temperature (> 0; default 1)")
    parser.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most probable tokens")
    parser.add_argument("--top-p", type=top_p, default=None,
                        help="sample among the fewest most probable tokens holding probability >= p, in (0, 1]")
    parser.add_argument("--num-beams", type=within(positive_int, 1, MAX_BEAMS), default=1,
                        help="beams for beam search")
    parser.add_argument("--length-penalty", default=1.0,
                        type=within(finite_float, -MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY),
                        help="beam search ranks by log p / length^this")
    parser.add_argument("--seed", type=seed, default=None, help="seed for sampling (printed when not given)")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at every step")
    parser.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence token")


def special_id(model, tokenizer, role: str) -> int | None:
    """The id of the "bos" or "eos" token: anatomy's own <SOS>/<EOS> where the vocabulary has it
    (the model was trained with it), else the model's config (config.json), else the tokenizer's."""
    own = tokenizer.token_to_id("<SOS>" if role == "bos" else "<EOS>")
    if own is not None:
        return own
    for name in ("decoder_start_token_id", "bos_token_id") if role == "bos" else ("eos_token_id",):
        if getattr(model.config, name, None) is not None:
            return getattr(model.config, name)
    return tokenizer.bos_id if role == "bos" else tokenizer.eos_id


class TextStreamer:
    """Prints the text of the tokens generated so far, as they come.

    Each step decodes the prompt and every new token so far, and prints what was not printed yet:
    a subword tokenizer may need several tokens for one character, and a word tokenizer puts
    spaces between words, so decoding tokens one by one would print the wrong text.
    """

    def __init__(self, tokenizer, prompt: list[int], out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids = list(prompt)
        self.printed = tokenizer.decode(self.ids)

    def __call__(self, tokens: list[int]) -> None:
        self.ids.append(tokens[0])  # the CLI generates one row
        decoded = self.tokenizer.decode(self.ids)
        if decoded.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            return
        if decoded.startswith(self.printed):
            self.out.write(printable(decoded[len(self.printed):], keep=KEEP))
            self.out.flush()
        self.printed = decoded


def chat_messages(args: argparse.Namespace) -> list[dict] | None:
    """--chat and --system as a conversation (None without --chat); checked before anything loads."""
    if args.system is not None and args.chat is None:
        raise ValueError("--system goes with --chat MESSAGE")
    if args.chat is None:
        return None
    if args.prompt or args.src is not None:
        raise ValueError("--chat MESSAGE is the whole input: leave out --prompt and --src")
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    return system + [{"role": "user", "content": args.chat}]


def check_arguments(args: argparse.Namespace) -> str:
    """What can be checked before the model loads: options that go together, and the model's
    family against --prompt, --src and --chat. Returns the strategy."""
    sampling = [name for name in ("temperature", "top_k", "top_p", "seed") if getattr(args, name) is not None]
    strategy = args.strategy or ("sample" if sampling else "beam" if args.num_beams > 1 else "greedy")
    if strategy != "sample" and sampling:
        raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in sampling)} only apply to --strategy sample")
    if strategy != "beam" and args.num_beams > 1:
        raise ValueError(f"--num-beams {args.num_beams} needs --strategy beam")
    from ..checkpoints.describe import config_of
    from ..checkpoints.toys import TOYS

    config = config_of(args.model)
    model = f"--model {one_line(args.model, 100)}"
    if config is None:  # a Hub id not downloaded yet: checked once it is loaded
        return strategy
    if config.arch == "encoder":
        raise ValueError(f"{model} is an encoder; generation needs a decoder or an encoder-decoder")
    if config.arch == "encoder-decoder" and args.chat is not None:
        raise ValueError(f"--chat needs a chat-tuned decoder; {model} is an encoder-decoder")
    if config.arch == "encoder-decoder" and args.src is None and args.model not in TOYS:
        raise ValueError("an encoder-decoder model needs --src TEXT")
    if config.arch == "decoder" and args.src is not None:
        raise ValueError(f"--src is for encoder-decoder models; {model} is a decoder (give --prompt)")
    return strategy


def default_input(args: argparse.Namespace, arch: str) -> None:
    """With nothing to continue or translate, what a toy was fitted on; and say so on stderr."""
    from ..checkpoints.toys import TOYS

    if args.chat is not None or args.prompt or (arch == "encoder-decoder" and args.src is not None):
        return
    if args.model in TOYS and arch == "decoder":
        args.prompt = " ".join(TOYS[args.model].text.split()[:TOY_PROMPT_WORDS])
        print(f"[no --prompt: continuing the toy's own sentence, “{args.prompt}”]", file=sys.stderr)
    elif args.model in TOYS:
        args.src = TOYS[args.model].text
        print(f"[no --src: translating the toy's own sentence, “{args.src}”]", file=sys.stderr)
    elif arch == "decoder":
        print("[no --prompt: generating from the end-of-text token, as after a finished text]", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    messages = chat_messages(args)
    strategy = check_arguments(args)
    import torch

    from ..checkpoints import from_pretrained, load_tokenizer
    from .generate import generate
    from .runner import context_window

    with Stages.of(args, sys.stderr, redirected=False) as stages:  # stdout is the text, stderr its notes
        stages.start("loading the model")
        model = from_pretrained(args.model, device=args.device)
    tokenizer = getattr(model, "tokenizer", None) or load_tokenizer(args.model)
    config = model.config
    encoder_decoder = config.arch == "encoder-decoder"
    if config.arch == "encoder":
        raise ValueError(f"--model {args.model} is an encoder; generation needs a decoder or an encoder-decoder")
    eos, bos = special_id(model, tokenizer, "eos"), special_id(model, tokenizer, "bos")
    default_input(args, config.arch)

    prompt = tokenizer.encode_prompt(args.prompt) if args.prompt else []
    kwargs = {}
    stops = None if args.no_stop or eos is None else [eos]
    if messages is not None:
        if encoder_decoder:
            raise ValueError(f"--chat needs a chat-tuned decoder; --model {args.model} is an encoder-decoder")
        prompt = tokenizer.encode_chat(messages)  # ChatError (a ValueError) when there is no template
        stops = None if args.no_stop else tokenizer.turn_end_ids() or stops
    elif encoder_decoder:
        if args.src is None:
            raise ValueError("an encoder-decoder model needs --src TEXT")
        kwargs["src_ids"] = torch.tensor([tokenizer.encode(args.src)], device=args.device)
        if bos is None:  # the decoder was trained to read <SOS> y1 y2 ...: it starts from <SOS>
            raise ValueError("the tokenizer has no start-of-sequence token to start the decoder from")
        prompt = [bos] + prompt
    elif args.src is not None:
        raise ValueError(f"--src is for encoder-decoder models; --model {args.model} is a decoder (give --prompt)")
    elif not prompt:
        # Nothing to continue: start from the end-of-sequence token, i.e. "after a finished text".
        start = eos if eos is not None else bos
        if start is None:
            raise ValueError("give --prompt TEXT (the tokenizer has no special token to start from)")
        prompt = [start]

    if strategy == "sample":
        kwargs.update({name: getattr(args, name) for name in ("temperature", "top_k", "top_p", "seed")
                       if getattr(args, name) is not None})
    streamer = TextStreamer(tokenizer, prompt) if strategy != "beam" else None

    if not encoder_decoder and messages is None:  # a chat prints only the answer
        sys.stdout.write(printable(args.prompt or "", keep=KEEP))
        sys.stdout.flush()
    began = time.perf_counter()
    out = generate(
        model, torch.tensor([prompt], device=args.device), strategy=strategy, max_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams, length_penalty=args.length_penalty if strategy == "beam" else 1.0,
        stop_tokens=stops, use_cache=not args.no_cache,
        streamer=streamer, **kwargs,
    )
    seconds = time.perf_counter() - began
    n_new = int(out.padding_mask[0, out.prompt_length:].sum())
    if streamer is None:
        whole, before = tokenizer.decode(out.sequences[0, :out.prompt_length + n_new].tolist()), tokenizer.decode(prompt)
        sys.stdout.write(printable(whole[len(before):] if whole.startswith(before) else whole, keep=KEEP))
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text first, then the notes and the summary on stderr
    window = context_window(model)
    if out.window_slid:
        cropped = f"the prompt's {len(prompt)} tokens were cut to their last {window}; " if len(prompt) > window else ""
        print(f"[{cropped}past the model's context of {window} tokens the window slid: each later token saw the "
              f"last {window}, recomputed (as nanoGPT does)]", file=sys.stderr)
    if messages is not None and not bool(out.finished[0]):
        print(f"[cut at --max-new-tokens {args.max_new_tokens}, before the end of the turn: raise it for the rest]",
              file=sys.stderr)
    seed = f", seed {out.seed}" if out.seed is not None else ""
    print(f"[{n_new} tokens in {seconds:.2f} s, {n_new / seconds:.1f} tokens/s; {strategy}{seed}; "
          f"cache {'off' if args.no_cache else 'on'}]", file=sys.stderr)
    return 0
