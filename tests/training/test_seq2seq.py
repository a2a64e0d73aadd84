"""An encoder-decoder trained by `anatomy train seq2seq` learns to copy a sequence exactly."""

import random

import numpy as np
import torch

import anatomy
from anatomy.cli import main
from anatomy.training.checkpoint import load_trained
from anatomy.training.evaluate import greedy_translate

SYMBOLS = "a b c d e f g h".split()


def sequences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(SYMBOLS) for _ in range(rng.randint(2, 5))] for _ in range(n)]


def test_copying_is_learned_to_exact_match_and_greedy_equals_anatomy_generate(tmp_path):
    train = sequences(3000, seed=0)
    (tmp_path / "train.src").write_text("".join(" ".join(s) + "\n" for s in train))
    (tmp_path / "train.tgt").write_text("".join(" ".join(s) + "\n" for s in train))
    code = main(["train", "seq2seq", "--src", str(tmp_path / "train.src"), "--tgt", str(tmp_path / "train.tgt"),
                 "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--tokenizer", "word",
                 "--d-model", "64", "--n-heads", "4", "--n-layers", "2", "--dropout", "0", "--max-len", "10",
                 "--pos-encoding", "learned",
                 "--batch-size", "64", "--max-steps", "300", "--schedule", "cosine", "--lr", "1.5e-3", "--min-lr-ratio", "0.5",
                 "--warmup", "20", "--label-smoothing", "0", "--weight-decay", "0", "--eval-every", "0", "--quiet", "--no-progress"])
    assert code == 0

    model, tok = load_trained(tmp_path / "run" / "model")
    test = [s for s in sequences(2000, seed=1) if s not in train][:200]
    sources = [np.array(tok.encode(" ".join(s))) for s in test]
    outputs = greedy_translate(model, tok, sources, max_len=10)
    exact = np.mean([tok.decode(o) == " ".join(s) for o, s in zip(outputs, test)])
    assert exact >= 0.99, exact

    # the trainer's greedy loop (KV cache, batched by length) agrees with anatomy.generate
    src = torch.tensor(np.stack([s for s in sources if len(s) == 5][:8]))
    generated = anatomy.generate(model, src_ids=src, max_new_tokens=10, strategy="greedy",
                                 decoder_start_token_id=tok.bos_id, stop_tokens=tok.eos_id, pad_token_id=tok.pad_id)
    ours = greedy_translate(model, tok, list(src.numpy()), max_len=10)
    for row, mine in zip(generated.sequences.tolist(), ours):
        row = [i for i in row if i not in (tok.bos_id, tok.pad_id)]
        assert row[:row.index(tok.eos_id)] == mine
