"""An encoder-decoder trained by `anatomy train seq2seq` learns to copy a sequence exactly."""

import random

import numpy as np
import torch

import anatomy
from anatomy.cli import main
from anatomy.training.checkpoint import load_trained
from anatomy.training.evaluate import translate

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
    outputs = translate(model, tok, sources, max_len=10)
    exact = np.mean([tok.decode(o) == " ".join(s) for o, s in zip(outputs, test)])
    assert exact >= 0.99, exact

    # the trainer's greedy loop (KV cache, batched by length) agrees with anatomy.generate
    src = torch.tensor(np.stack([s for s in sources if len(s) == 5][:8]))
    generated = anatomy.generate(model, src_ids=src, max_new_tokens=10, strategy="greedy",
                                 decoder_start_token_id=tok.bos_id, stop_tokens=tok.eos_id, pad_token_id=tok.pad_id)
    ours = translate(model, tok, list(src.numpy()), max_len=10)
    for row, mine in zip(generated.sequences.tolist(), ours):
        row = [i for i in row if i not in (tok.bos_id, tok.pad_id)]
        assert row[:row.index(tok.eos_id)] == mine


def test_beam_translation_in_batches_equals_each_sentence_searched_alone():
    """BLEU's beam search (evaluate.translate: sorted by length, batch_size / beams sentences a batch,
    padded) returns for every sentence what anatomy.generate's beam search gives it alone."""

    class Ids:  # the special ids a tokenizer would give
        pad_id, bos_id, eos_id = 0, 1, 2

    model = anatomy.build_model(anatomy.ModelConfig(arch="encoder-decoder", vocab_size=12, d_model=32, n_heads=4,
                                                    n_layers=1, d_ff=64, max_seq_len=12, pad_token_id=0), seed=3)
    model.eval()
    rng = np.random.default_rng(0)
    sources = [rng.integers(3, 12, size=rng.integers(2, 8)) for _ in range(7)]
    for penalty in (0.0, 1.0):
        batched = translate(model, Ids, sources, max_len=8, batch_size=9, beams=3, length_penalty=penalty)
        for source, mine in zip(sources, batched):
            alone = anatomy.generate(model, src_ids=torch.from_numpy(source[None]), max_new_tokens=8, strategy="beam",
                                     num_beams=3, length_penalty=penalty, decoder_start_token_id=1, stop_tokens=2,
                                     pad_token_id=0).new_tokens[0].tolist()
            assert mine == (alone[:alone.index(2)] if 2 in alone else alone)
    greedy = translate(model, Ids, sources, max_len=8)
    assert greedy != translate(model, Ids, sources, max_len=8, beams=3, length_penalty=1.0)  # the search matters
