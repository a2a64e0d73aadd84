"""The run folder under `anatomy train`: one writer at a time, plain records, readable files, checkpoints
that fall back when damaged or hostile, a full disk reported, and every mistake one line with status 2."""

import errno
import json
import os
import stat

import pytest
import torch

from anatomy.cli import main
from anatomy.training import checkpoint as ckpt
from anatomy.training.metrics import read_metrics
from anatomy.training.rundir import RunLock

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 4


def train(tmp_path, out="run", *extra, quiet=True):
    data = tmp_path / "text.txt"
    if not data.exists():
        data.write_text(TEXT)
    try:  # an argparse mistake exits (status 2) from inside main
        return main(["train", "lm", "--data", str(data), "--out", str(tmp_path / out), "--cache-dir",
                     str(tmp_path / "cache"), "--context", "16", "--batch-size", "4", "--d-model", "32", "--n-layers",
                     "1", "--n-heads", "4", "--log-every", "1", "--eval-every", "0", "--eval-batches", "2",
                     "--no-progress", *(["--quiet"] if quiet else []), *extra])
    except SystemExit as exit:
        return exit.code


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path, capsys):
    with RunLock(tmp_path / "run"):
        assert train(tmp_path, "run", "--max-steps", "2") == 2
        err = capsys.readouterr().err
        assert f"is in use by another run (process {os.getpid()})" in err and err.count("\n") == 1
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]  # it wrote nothing
    assert not (tmp_path / "run" / ".lock").exists()  # removed by its holder
    assert train(tmp_path, "run", "--max-steps", "2") == 0
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 2]


def test_a_stale_lock_file_from_a_dead_run_does_not_block(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text("999999999\n")
    assert train(tmp_path, "run", "--max-steps", "1") == 0


def test_the_lock_is_removed_when_the_run_ends_however_it_ends(tmp_path):
    assert train(tmp_path, "run", "--max-steps", "1") == 0
    assert not (tmp_path / "run" / ".lock").exists()
    assert train(tmp_path, "run", "--max-steps", "1", "--batch-size", "0") == 2  # refused by argparse
    assert train(tmp_path, "other", "--max-steps", "1", "--resume") == 0
    assert not list((tmp_path / "run").glob(".lock*")) and not list((tmp_path / "other").glob(".lock*"))


def _contend(run_dir: str, rounds: int) -> tuple[int, list[str]]:
    """In a child process: try to take the lock `rounds` times; while holding it, prove that nobody
    else does (an exclusive marker file). Returns (times held, refusals that named no live process)."""
    import re

    from anatomy.training.rundir import RunFolderInUse

    held, bad = 0, []
    for _ in range(rounds):
        try:
            lock = RunLock(run_dir).acquire()
        except RunFolderInUse as refused:
            if not re.search(r"process \d+\)", str(refused)):
                bad.append(str(refused))
            continue
        marker = os.open(os.path.join(run_dir, "holder"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # fails if two hold
        os.close(marker)
        os.unlink(os.path.join(run_dir, "holder"))
        lock.release()
        held += 1
    return held, bad


def test_a_refusal_always_names_the_holder_and_one_run_holds_at_a_time(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(6) as pool:
        results = pool.starmap(_contend, [(str(tmp_path), 200)] * 6)
    assert sum(held for held, _ in results) > 0
    assert [message for _, bad in results for message in bad] == []  # never "process unknown"
    assert not list(tmp_path.iterdir())  # no lock and no pending lock file left


def test_temporaries_of_killed_saves_are_removed_at_start(tmp_path):
    killed = tmp_path / "run" / "checkpoints" / ".step-00000008.tmp4242"
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"half")
    (tmp_path / "run" / ".metrics.jsonl.tmp4242").write_text("{")
    assert train(tmp_path, "run", "--max-steps", "1") == 0
    left = [p.name for p in (tmp_path / "run").rglob("*") if ".tmp" in p.name]
    assert left == []


def test_train_args_are_plain_values_with_the_real_vocabulary_and_files_are_0644(tmp_path):
    old_umask = os.umask(0o022)
    try:
        assert train(tmp_path, "run", "--max-steps", "2", "--save-every", "1") == 0
    finally:
        os.umask(old_umask)
    saved = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert not any(k.startswith("_") for k in saved)
    assert all(isinstance(v, (str, int, float, bool, type(None), list)) for v in saved.values()), saved
    assert saved["vocab_size"] == len(set(TEXT)) + 4  # every character, and <PAD> <UNK> <SOS> <EOS>
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"model.safetensors", "optimizer.pt", "metrics.jsonl", "tokenizer.json"}
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes


def test_the_start_up_summary_gives_the_runs_real_numbers(tmp_path, capsys):
    assert train(tmp_path, "run", "--max-steps", "3", "--grad-accum", "2", quiet=False) == 0
    printed = capsys.readouterr().out
    summary = [line for line in printed.splitlines() if line.startswith("  ")]  # under the first line
    assert summary and max(len(line) for line in summary) <= 80, summary  # it folds to 80 columns
    out = " ".join(printed.split())  # a folded value read as one line
    model, tok = ckpt.load_trained(tmp_path / "run" / "model")
    n_train = int(len(TEXT) * 0.9)
    assert f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters" in out
    assert f"vocabulary {tok.vocab_size:,} tokens (char)" in out
    assert f"{n_train:,} tokens train, {len(TEXT) - n_train:,} validation" in out
    assert f"3 x 128 tokens per step (4 x 16 tokens x 2 micro-batch(es) x 1 rank(s))" in out
    assert f"cpu, {torch.get_num_threads()} thread(s)" in out


def test_a_full_disk_is_reported_and_the_previous_checkpoint_kept(tmp_path, monkeypatch, capsys):
    real_save = torch.save

    def disk_full_at_step_2(obj, path, *args, **kwargs):
        if "step-00000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", disk_full_at_step_2)
    assert train(tmp_path, "run", "--max-steps", "3", "--save-every", "1") == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "previous checkpoint (step-00000001) is kept" in err
    assert err.count("\n") == 1
    assert ckpt.find_checkpoint(tmp_path / "run").name == "step-00000001"
    assert not list((tmp_path / "run" / "checkpoints").glob(".step-*"))


def _save_two_checkpoints(tmp_path):
    assert train(tmp_path, "run", "--max-steps", "4", "--save-every", "2") == 0
    return tmp_path / "run" / "checkpoints" / "step-00000004"


def _rewrite_consistently(path, name, data: bytes):
    """Replace a checkpoint file and update its manifest to match: only the content can give it away."""
    (path / name).write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest[name] = {"bytes": len(data), "sha256": ckpt._sha256(path / name)}
    (path / "manifest.json").write_text(json.dumps(manifest))


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading a checkpoint",))


def test_a_pickle_planted_in_the_optimizer_state_falls_back_without_running(tmp_path, capsys):
    latest = _save_two_checkpoints(tmp_path)
    whole = [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    torch.save({"optimizer": Payload(), "scheduler": {}, "torch_rng": torch.get_rng_state()}, tmp_path / "evil.pt")
    _rewrite_consistently(latest, "optimizer.pt", (tmp_path / "evil.pt").read_bytes())
    capsys.readouterr()
    with pytest.warns(UserWarning, match="step-00000004.*[Ww]eights only load failed.*resuming from step-00000002"):
        assert train(tmp_path, "run", "--max-steps", "4", "--save-every", "2", "--resume") == 0
    assert "this ran" not in capsys.readouterr().out
    # steps 3 and 4 ran again from the step-2 checkpoint, exactly as the first time
    assert [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r] == whole


def test_a_state_json_without_a_numeric_step_falls_back(tmp_path):
    latest = _save_two_checkpoints(tmp_path)
    _rewrite_consistently(latest, "state.json", json.dumps({"step": "x"}).encode())
    with pytest.warns(UserWarning, match="state.json has step 'x'"):
        assert train(tmp_path, "run", "--max-steps", "4", "--save-every", "2", "--resume") == 0


def test_all_checkpoints_damaged_is_one_line_naming_each(tmp_path, capsys):
    latest = _save_two_checkpoints(tmp_path)
    _rewrite_consistently(latest, "state.json", b"{}")
    (tmp_path / "run" / "checkpoints" / "step-00000002" / "model.safetensors").write_bytes(b"x")
    capsys.readouterr()
    assert train(tmp_path, "run", "--max-steps", "6", "--resume") == 2
    err = capsys.readouterr().err
    assert "no loadable checkpoint" in err and "step-00000004" in err and "step-00000002" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("bad", [
    ["--log-every", "0"], ["--grad-accum", "0"], ["--eval-batches", "0"], ["--label-smoothing", "2"],
    ["--max-steps", "0"], ["--max-steps", "-5"], ["--eval-every", "-1"], ["--save-every", "-3"],
    ["--warmup", "-10"], ["--clip", "-1"], ["--lr", "nan"], ["--beta2", "1"], ["--dropout", "1.5"],
    ["--src", "x.de"], ["--device", "cuda:7"], ["--device", "tpu"],
])
def test_every_bad_argument_is_one_line_and_status_2_before_anything_is_written(tmp_path, capsys, bad):
    assert train(tmp_path, "run", *bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_device_that_is_absent_is_named(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert train(tmp_path, "run", "--device", "cuda") == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err


def test_architecture_flags_reach_the_model(tmp_path):
    """The ablation's flags (recipes/ablation.sh) change the model they name, and only that."""
    assert train(tmp_path, "run", "--max-steps", "1", "--norm", "rmsnorm", "--activation", "swiglu", "--d-ff", "85",
                 "--pos-encoding", "rotary", "--no-bias", "--untied", "--qk-norm", "per_head") == 0
    config = ckpt.load_trained(tmp_path / "run" / "model")[0].config
    assert (config.norm, config.activation, config.d_ff, config.pos_encoding, config.qk_norm) == \
        ("rmsnorm", "swiglu", 85, "rotary", "per_head")
    assert not (config.attn_bias or config.attn_out_bias or config.mlp_bias or config.tie_embeddings)


def test_sinusoidal_positions_come_with_the_papers_embedding_scale(tmp_path):
    """Token embeddings x sqrt(d_model) under unit-amplitude sinusoids (Vaswani et al., 3.4), for
    every family: without it a character LM's tokens (initialised at std 0.02) are drowned."""
    assert train(tmp_path, "sin", "--max-steps", "1", "--pos-encoding", "sinusoidal") == 0
    assert train(tmp_path, "learned", "--max-steps", "1") == 0
    assert ckpt.load_trained(tmp_path / "sin" / "model")[0].config.scale_embeddings
    assert not ckpt.load_trained(tmp_path / "learned" / "model")[0].config.scale_embeddings
