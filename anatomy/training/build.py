"""What a run is made of, from the command-line arguments: its tokenizer, data, task and model.

Each builder returns (model, task, tokenizer). Rank 0 trains the tokenizer and writes the token
caches; the other ranks wait at a barrier and then read what rank 0 wrote. A resumed run keeps the
tokenizer and the model shape saved in its folder, whatever the command line says now.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoints import from_pretrained, load_tokenizer
from ..config import ModelConfig
from ..models import build_model
from . import distributed
from .checkpoint import make_readable, write_text_atomically
from .data import LMBatches, classification_data, parallel_text, read_tsv, split_tokens, tokenize_to_memmap
from .ensemble import load_members
from .tasks import ClassifyTask, LMTask, Seq2SeqTask
from .tokenizers import KINDS, Tokenizer, train_tokenizer

# The run's model shape, fixed at its start (not config.json: the finished model/ holds that).
RUN_CONFIG = "model_config.json"
DEFAULT_VOCAB_SIZE = 8000  # for word, bpe and wordpiece; a char vocabulary is every character seen


def model_config(args, **fields) -> ModelConfig:
    return ModelConfig(
        d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers, d_ff=args.d_ff or 4 * args.d_model,
        dropout=args.dropout, pos_encoding=args.pos_encoding, norm=args.norm, norm_position=args.norm_position,
        activation=args.activation, qk_norm=args.qk_norm, attn_bias=args.bias, attn_out_bias=args.bias,
        mlp_bias=args.bias, tie_embeddings=not args.untied, attn_impl=args.attn_impl,
        # the paper multiplies embeddings by sqrt(d_model) so that tokens are not drowned by the
        # unit-amplitude sinusoids; against learned positions (initialised as small as the tokens) it
        # would drown the positions instead
        scale_embeddings=args.pos_encoding == "sinusoidal", **fields)


def task_fields(args) -> dict:
    """The config fields the task fixes; model_config takes the rest from the command line."""
    if args.task == "lm":
        return {"arch": "decoder", "max_seq_len": args.context}
    if args.task == "seq2seq":
        return {"arch": "encoder-decoder", "max_seq_len": args.max_len + 1}
    return {"arch": "encoder", "max_seq_len": args.max_len, "head": "sequence-classification", "pooling": args.pooling}


def planned_config(args, run_dir: Path) -> ModelConfig:
    """The model the run will build, known before its tokenizer is trained: a resumed run's saved
    shape, else the command line's with the vocabulary of a given tokenizer file, or --vocab-size
    (default DEFAULT_VOCAB_SIZE), which bounds what a trained tokenizer ends with (a char
    vocabulary, every character seen, is usually far smaller). Raises ConfigError (a ValueError)
    for a shape that cannot be built, such as d_model not divisible by n_heads."""
    saved = run_dir / RUN_CONFIG
    if args.resume and saved.exists():
        return ModelConfig.from_json(saved.read_text())
    vocab_size = args.vocab_size or DEFAULT_VOCAB_SIZE
    if args.tokenizer not in KINDS:
        vocab_size = Tokenizer.load(args.tokenizer).vocab_size
    labels = {"num_labels": len(args.labels.split(","))} if args.task == "classify" and args.labels else {}
    return model_config(args, **task_fields(args), vocab_size=vocab_size, **labels)


def _tokenizer(args, run_dir: Path, files: list[str], info) -> Tokenizer:
    """The run's tokenizer: the one saved in the run (resume), a given file, or trained on `files`
    by rank 0 and then read by every rank."""
    saved = run_dir / "tokenizer.json"
    if not saved.exists() and info.is_main:
        if args.tokenizer in KINDS:
            tok = train_tokenizer(args.tokenizer, files=files, vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE)
        else:
            tok = Tokenizer.load(args.tokenizer)
        _save_tokenizer(tok, run_dir)
    distributed.barrier()
    return Tokenizer.load(saved)


def _save_tokenizer(tok: Tokenizer, run_dir: Path) -> None:
    tok.save(run_dir)
    for written in run_dir.glob("tokenizer*.json"):
        make_readable(written)


def _build_model(args, run_dir: Path, cfg: ModelConfig):
    """A fresh model of `cfg`, or of the run's saved config when resuming (the run's shape wins)."""
    saved = run_dir / RUN_CONFIG
    if saved.exists():
        cfg = ModelConfig.from_json(saved.read_text())
    elif distributed.is_main():
        write_text_atomically(saved, cfg.to_json())
    torch.manual_seed(args.seed)  # same initial weights on every rank and every rerun
    return build_model(cfg)


def lm(args, run_dir: Path, info):
    tok = _tokenizer(args, run_dir, [args.data], info)
    ids = tokenize_to_memmap(args.data, tok, args.cache_dir)
    if args.val_data:
        train_ids, val_ids = ids, tokenize_to_memmap(args.val_data, tok, args.cache_dir)
    else:
        train_ids, val_ids = split_tokens(ids, args.val_fraction)
    model = _build_model(args, run_dir, model_config(args, **task_fields(args), vocab_size=tok.vocab_size))
    train = LMBatches(train_ids, args.context, args.batch_size, args.seed, info.rank, info.world_size)
    val = LMBatches(val_ids, args.context, args.batch_size, args.seed + 1)
    return model, LMTask(train, val, args.eval_batches), tok


def seq2seq(args, run_dir: Path, info):
    # one joint subword vocabulary for both languages, so encoder and decoder share one embedding
    tok = _tokenizer(args, run_dir, [args.src, args.tgt], info)
    if info.is_main:
        src, tgt = parallel_text(args.src, args.tgt, tok, tok, args.cache_dir)
    distributed.barrier()
    src, tgt = parallel_text(args.src, args.tgt, tok, tok, args.cache_dir)
    val = parallel_text(args.val_src, args.val_tgt, tok, tok, args.cache_dir) if args.val_src else None
    bleu_set = None
    if args.test_src:
        test_src, _ = parallel_text(args.test_src, args.test_tgt, tok, tok, args.cache_dir)
        refs = Path(args.test_tgt).read_text(encoding="utf-8").splitlines()
        bleu_set = (test_src, [r.strip() for r in refs])
    model = _build_model(args, run_dir, model_config(args, **task_fields(args), vocab_size=tok.vocab_size,
                                                     pad_token_id=tok.pad_id))
    task = Seq2SeqTask(src, tgt, tok, args.batch_size, args.max_len, args.seed, info.rank, info.world_size,
                       val=val, bleu_set=bleu_set, bleu_max=args.bleu_samples, beams=args.beams,
                       length_penalty=args.length_penalty)
    return model, task, tok


def classify(args, run_dir: Path, info):
    labels = args.labels.split(",") if args.labels else None
    if args.init:
        model, tok = _pretrained_classifier(args, run_dir, labels)
    else:
        tok = _tokenizer(args, run_dir, [args.train], info)
        model = None
    if info.is_main:
        classification_data(args.train, tok, labels, cache_dir=args.cache_dir)
    distributed.barrier()
    seqs, y, names = classification_data(args.train, tok, labels, cache_dir=args.cache_dir)
    if info.is_main:
        write_text_atomically(run_dir / "labels.json", json.dumps(names))
    val = None
    if args.val:
        val_seqs, val_y, _ = classification_data(args.val, tok, names, cache_dir=args.cache_dir)
        val = (val_seqs, val_y)
    if model is None:
        model = _build_model(args, run_dir, model_config(args, **task_fields(args), vocab_size=tok.vocab_size,
                                                         num_labels=len(names), pad_token_id=tok.pad_id))
    elif model.config.num_labels != len(names):
        raise ValueError(f"--labels gives {model.config.num_labels} labels, {args.train} has {len(names)}")
    members = load_members(args.ensemble_with, args.val, names, args.cache_dir) if args.ensemble_with else []
    return model, ClassifyTask(seqs, y, tok, args.batch_size, args.max_len, args.seed, info.rank,
                               info.world_size, val=val, token_dropout=args.token_dropout, members=members), tok


def _pretrained_classifier(args, run_dir: Path, labels: list[str] | None):
    """An encoder from `anatomy.from_pretrained(args.init)` with a fresh classification head.

    Every pretrained weight must find its place (only the new head may be missing); weights the
    classifier has no use for (a masked-LM head, a pooler) are listed and dropped."""
    pretrained = from_pretrained(args.init)
    if pretrained.config.arch != "encoder":
        raise ValueError(f"--init {args.init} is a {pretrained.config.arch}; classify fine-tunes an encoder")
    tok = load_tokenizer(args.init)
    if labels is None:
        labels = read_tsv(args.train).label_names
    cfg = pretrained.config.replace(head="sequence-classification", num_labels=len(labels), pooling=args.pooling,
                                    dropout=args.dropout)
    torch.manual_seed(args.seed)
    model = build_model(cfg)
    missing, unexpected = model.load_state_dict(pretrained.state_dict(), strict=False)
    not_head = [k for k in missing if not k.startswith("classifier")]
    if not_head:
        raise ValueError(f"{args.init}: pretrained weights lack {not_head[:5]}")
    if unexpected and not args.quiet:
        print(f"fine-tuning {args.init}: dropped weights the classifier does not use: {', '.join(unexpected)}")
    write_text_atomically(run_dir / RUN_CONFIG, cfg.to_json())
    _save_tokenizer(tok, run_dir)
    return model, tok


BUILDERS = {"lm": lm, "seq2seq": seq2seq, "classify": classify}
