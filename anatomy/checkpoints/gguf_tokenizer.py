"""The tokenizer of a GGUF file, rebuilt from its metadata with Hugging Face `tokenizers`.

A GGUF file has no tokenizer.json; llama.cpp keeps the vocabulary as metadata:
    tokenizer.ggml.model        "gpt2": byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM)
                                "llama": SentencePiece-style BPE with byte fallback (Llama 1/2, Mistral)
    tokenizer.ggml.tokens       every token, in id order
    tokenizer.ggml.merges       the BPE merges, best first ("Ġ t")        (gpt2; sometimes llama)
    tokenizer.ggml.scores       one score per token                       (llama)
    tokenizer.ggml.token_type   1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
    tokenizer.ggml.pre          how text is cut before BPE ("llama-bpe", "qwen2", "smollm", ...)
    tokenizer.ggml.*_token_id   bos, eos, unknown, padding; add_bos_token / add_eos_token
    tokenizer.chat_template     the Jinja chat template
Each piece goes to the `tokenizers` component that does the same job.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from .files import CheckpointError, shorten
from .tokenizer import Tokenizer

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp's token types

# How llama.cpp cuts text before byte-level BPE, by tokenizer.ggml.pre (src/llama-vocab.cpp).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2),
}
# These split every digit off first, then cut the rest as GPT-2 does.
DIGITS_FIRST = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: byte-level BPE spells every byte as a visible
    character (a space is "Ġ", a newline "Ċ"), so that merges never see raw control bytes."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def _byte_level(meta: dict, tokens: list[str]) -> Backend:
    """Byte-level BPE: tokens spelled in GPT-2's byte alphabet, merges from the file."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token written with characters outside the alphabet is re-spelled byte by byte.
    spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", ())]
    backend = Backend(models.BPE({t: i for i, t in enumerate(spelled)}, merges, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre")
    if pre in SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in DIGITS_FIRST:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:  # "default", "gpt2", or a type llama.cpp names that anatomy has no regex for: GPT-2's own
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE joins, at each step, the adjacent pair whose joined piece scores highest.
    As a merge list: every cut of a token into two tokens, ranked by the whole token's score
    (ties: the longer left piece, then the longer right piece, then token order)."""
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for token, score in zip(tokens, scores):
        cuts = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ids and token[k:] in ids]
        ranked += [(score, left, right) for left, right in sorted(cuts, key=lambda c: (ids[c[0]], ids[c[1]]))]
    ranked.sort(key=lambda m: (-m[0], -len(m[1]), -len(m[2])))
    return [(left, right) for _, left, right in ranked]


# Gemma's files differ in two ways: a token of spaces is written with real spaces ("  ", where the
# vocabulary means "▁▁"), and the scores do not follow the merge order; the tokens' order does.
TOKEN_ORDER_MERGES = ("gemma", "gemma2", "gemma3")
# Phi-3 puts "▁" before the text even when it starts with a space ("  hi" -> "▁▁▁hi", where the
# Metaspace rule of Llama's tokenizer gives "▁▁hi").
PREPEND_ALWAYS = ("phi3",)


def _sentencepiece(meta: dict, tokens: list[str]) -> Backend:
    """SentencePiece-style BPE: "▁" marks a space, unknown characters fall back to <0xNN> bytes."""
    scores = meta.get("tokenizer.ggml.scores")
    if meta.get("general.architecture") in TOKEN_ORDER_MERGES:
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    if "tokenizer.ggml.merges" in meta:
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    elif scores is not None:
        merges = sentencepiece_merges(tokens, scores)
    else:
        raise CheckpointError("a 'llama' GGUF tokenizer needs tokenizer.ggml.scores or tokenizer.ggml.merges")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    backend = Backend(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=True, byte_fallback=True,
                                 unk_token=tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None))
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)  # "hello" is encoded as "▁hello"
    if meta.get("general.architecture") in PREPEND_ALWAYS:
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return backend


BUILDERS = {"gpt2": (_byte_level, False), "llama": (_sentencepiece, True)}  # model -> (builder, adds BOS by default)
# What each tokenizer value must be when present (tokenizer.ggml.* unless named in full).
STRING_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template")
BOOLEAN_KEYS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix")
ID_KEYS = tuple(f"tokenizer.ggml.{role}_token_id" for role in ("bos", "eos", "unknown", "padding", "seperator", "cls",
                                                                  "mask"))


def check_tokenizer_metadata(meta: dict, source: str) -> None:
    """The types of every tokenizer value a GGUF file gives, checked before anything is built from
    them (open_gguf checks them before any weight is dequantized): tokens a list of strings; token
    types a list of integers and scores a list of numbers, one per token; merges strings "left right";
    ids integers >= 0; flags booleans; the model, pre-tokenizer and chat template strings.
    Raises CheckpointError naming the key (and the first wrong item) otherwise."""
    def refuse(key: str, value, allowed: str):
        raise CheckpointError(f"GGUF file {shorten(source)!r} gives {key} = {shorten(repr(value), 60)}; "
                              f"it must be {allowed}")

    for key, kind, allowed in ((STRING_KEYS, str, "a string"), (BOOLEAN_KEYS, bool, "a boolean")):
        for name in key:
            if name in meta and not isinstance(meta[name], kind):
                refuse(name, meta[name], allowed)
    for name in ID_KEYS:
        value = meta.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            refuse(name, value, "a token id (an integer >= 0)")
    tokens = meta.get("tokenizer.ggml.tokens")
    lists = {"tokenizer.ggml.tokens": (lambda t: isinstance(t, str), "a string"),
             "tokenizer.ggml.token_type": (lambda t: isinstance(t, int) and not isinstance(t, bool), "an integer"),
             "tokenizer.ggml.scores": (lambda t: isinstance(t, (int, float)) and not isinstance(t, bool), "a number"),
             "tokenizer.ggml.merges": (lambda t: isinstance(t, str) and " " in t, 'a string "left right"')}
    for name, (fits, allowed) in lists.items():
        if name not in meta:
            continue
        values = meta[name]
        if not isinstance(values, list):
            refuse(name, values, "a list")
        wrong = next((i for i, value in enumerate(values) if not fits(value)), None)
        if wrong is not None:
            refuse(f"{name}[{wrong}]", values[wrong], f"{allowed}, as every item")
        per_token = name in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")
        if per_token and isinstance(tokens, list) and len(values) != len(tokens):
            raise CheckpointError(f"GGUF file {shorten(source)!r} gives {len(values)} {name} for {len(tokens)} tokens; "
                                  "it must give one per token")


def tokenizer_from_metadata(meta: dict, source: str) -> Tokenizer:
    """anatomy's Tokenizer for a GGUF file's metadata (see the module docstring for the keys).

    Raises CheckpointError naming `source` when the file has no tokenizer or one of another kind."""
    check_tokenizer_metadata(meta, source)
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind not in BUILDERS or not tokens:
        raise CheckpointError(
            f"GGUF file {source!r} has tokenizer.ggml.model={shorten(repr(kind), 60)}"
            + ("" if tokens else " and no tokens") + f"; anatomy reads: {', '.join(BUILDERS)}")
    build, adds_bos = BUILDERS[kind]
    try:
        backend = build(meta, tokens)
    except Exception as error:  # tokenizers raises a bare Exception: a merge of tokens the vocabulary lacks
        raise CheckpointError(f"GGUF file {source!r} holds a tokenizer that cannot be built: {shorten(str(error), 200)}"
                              ) from None
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    in_alphabet = set(bytes_to_unicode().values()) if kind == "gpt2" else None
    # Control tokens (<|im_start|>, <s>) are matched whole and are "special"; user-defined ones
    # (<think>) are matched whole too but kept when decoding. A byte-level control token written
    # outside the byte alphabet is a mislabel, and stays an ordinary token.
    backend.add_special_tokens([
        AddedToken(t, normalized=False, special=True) for t, kind_ in zip(tokens, types)
        if kind_ in (UNKNOWN, CONTROL) and (in_alphabet is None or set(t) <= in_alphabet)])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, kind_ in zip(tokens, types)
                        if kind_ == USER_DEFINED and backend.token_to_id(t) is not None])
    ids = {role: meta.get(f"tokenizer.ggml.{key}_token_id")
           for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))}
    ids = {role: i if isinstance(i, int) and 0 <= i < len(tokens) else None for role, i in ids.items()}
    # BOS / EOS around every text, as add_bos_token / add_eos_token say (SentencePiece: BOS by default)
    head = [ids["bos"]] if meta.get("tokenizer.ggml.add_bos_token", adds_bos) and ids["bos"] is not None else []
    tail = [ids["eos"]] if meta.get("tokenizer.ggml.add_eos_token", False) and ids["eos"] is not None else []
    if head or tail:
        backend.post_processor = processors.TemplateProcessing(
            single=[tokens[i] for i in head] + ["$A"] + [tokens[i] for i in tail],
            special_tokens=sorted({(tokens[i], i) for i in head + tail}))
    return Tokenizer(backend, bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"], unk_id=ids["unk"],
                     chat_template=meta.get("tokenizer.chat_template"))
