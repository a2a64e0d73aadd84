"""Nothing left behind: a save killed halfway or failing leaves the target folder as it was, and the
next save removes what the killed one left beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy.checkpoints import writing


KILLED_SAVE = """
import sys, time
from anatomy.checkpoints import writing
import anatomy

def save_then_hang(tensors, path, metadata=None):
    # what safetensors does: the data into a temporary file beside the target, renamed at the end;
    # this writer is killed while the temporary file is half written
    with open(path.rsplit("/", 1)[0] + "/.tmpKILLED", "wb") as partial:
        partial.write(bytes(4 * 2**20))
    print("writing", flush=True)
    time.sleep(600)

writing.save_file = save_then_hang
anatomy.save_pretrained(anatomy.from_pretrained("toy"), sys.argv[1])
"""


def test_a_save_killed_halfway_leaves_nothing_in_the_folder(tmp_path):
    """kill -9 during the weights' write: the target folder keeps what it held (nothing, or the
    previous save), and the next save removes the staging folder the killed one left beside it."""
    for before in ("absent", "previous save"):
        target = tmp_path / before.replace(" ", "-")
        if before == "previous save":
            anatomy.save_pretrained(anatomy.from_pretrained("toy-encoder"), target)
        held = {p.name: p.read_bytes() for p in target.iterdir()} if target.exists() else None
        writer = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(target)], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            assert writer.stdout.readline().strip() == "writing"
        finally:
            writer.kill()
            writer.wait()
        now = {p.name: p.read_bytes() for p in target.iterdir()} if target.exists() else None
        assert now == held, f"{before}: the folder changed to {sorted(now or [])}"
        assert len(list(tmp_path.glob(f".{target.name}.saving-*"))) == 1  # the killed save's staging folder
        anatomy.save_pretrained(anatomy.from_pretrained("toy"), target)
        assert not list(tmp_path.glob(f".{target.name}.saving-*"))
        assert not [p.name for p in target.iterdir() if p.name.startswith(".")]
        assert torch.equal(anatomy.from_pretrained(target)(torch.tensor([[1, 2]])).logits,
                           anatomy.from_pretrained("toy")(torch.tensor([[1, 2]])).logits)


def test_a_save_that_fails_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    target = tmp_path / "model"
    anatomy.save_pretrained(anatomy.from_pretrained("toy"), target)
    held = {p.name: p.read_bytes() for p in target.iterdir()}

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writing, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        anatomy.save_pretrained(anatomy.from_pretrained("toy-encoder"), target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == held
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_new_save_replaces_every_file_of_the_previous_one(tmp_path):
    target = tmp_path / "model"
    anatomy.save_pretrained(anatomy.from_pretrained("toy"), target, max_shard_size=1000)  # shards and an index
    assert (target / "model.safetensors.index.json").is_file()
    anatomy.save_pretrained(anatomy.from_pretrained("toy-encoder"), target)  # one file
    assert sorted(p.name for p in target.iterdir()) == ["anatomy_config.json", "model.safetensors", "tokenizer.json",
                                                       "tokenizer_config.json"]
    assert anatomy.from_pretrained(target).config == anatomy.from_pretrained("toy-encoder").config
