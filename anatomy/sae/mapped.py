"""Tensors of a weights file, memory-mapped: every size checked from the headers before a byte is read.

    weights = mapped_file("layer_3.safetensors")       # or a Gemma Scope params.npz
    weights.shapes                                     # {"W_enc": (16384, 2304), ...}, from the header alone
    weights.tensor("W_enc")                            # a view of the file's pages, read as they are touched

Two layouts:

    .safetensors   8 bytes n, n bytes of JSON {name: {dtype, shape, data_offsets}}, then the data
    .npz           a zip of .npy members (a magic, a header {descr, fortran_order, shape}, then the data),
                   stored (numpy.savez) or deflated (numpy.savez_compressed)

What a file declares is held to what it is, so that no file makes anatomy read, allocate or decompress
more than it holds:

- a safetensors header's offsets must lie inside the file (checkpoints.files.read_safetensors_header);
- a file must hold its tensors' bytes on disk: a sparse file (a 3 GiB hole) declaring gigabytes is refused;
- an npz's central directory is bounded before it is parsed, no member is named twice, each member's
  header must agree with its stored size, and a deflated member may expand at most MAX_RATIO times
  (a zip bomb of 8 MB declaring 4 GiB is refused): it is inflated into an array of the declared size,
  never more;
- nothing is unpickled: an npz member of Python objects is refused from its header.

A stored member and a safetensors tensor are mapped copy-on-write (numpy.memmap mode "c"): nothing is
read until used, and nothing written goes back to the file. Every problem is a CheckpointError naming
the file.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..checkpoints.files import CheckpointError, read_safetensors_header, shorten

FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}  # bf16: read as its bits
MAX_RATIO = 32  # what a deflated member may expand to, beyond MAX_SLACK: weights deflate by 10% at most
MAX_SLACK = 1 << 20
MAX_MEMBERS = 64  # a transcoder's npz holds five or six arrays
SPARSE_FLOOR = 16 << 20  # below this many declared bytes, a file's block count is not looked at
CHUNK_ROWS = 1 << 22  # elements checked for finiteness at a time
MAX_HEADER_BYTES = 1 << 20  # a transcoder file's safetensors header names a handful of tensors


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: its shape and numpy dtype, where its bytes start (a stored one), in which order,
    whether they are bfloat16 bits, and the member and header length of a deflated npz member."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int = 0
    fortran: bool = False
    bf16: bool = False
    deflated: tuple | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class MappedFile:
    """One weights file: `entries` ({name: Entry}, from its headers), `shapes`, and `tensor(name)` its data."""

    def __init__(self, path: Path, entries: dict[str, Entry]):
        self.path, self.entries = path, entries
        self.shapes = {name: entry.shape for name, entry in entries.items()}
        self.where = repr(shorten(str(path)))

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor `name` in the file's own dtype: mapped copy-on-write, or (a deflated npz member)
        inflated into an array of its declared size."""
        entry = self.entries[name]
        count = int(np.prod(entry.shape, dtype=np.int64))
        try:
            if entry.deflated is not None:
                array = self._inflate(name, entry, count)
            elif count == 0:
                array = np.empty(0, dtype=entry.dtype)
            else:
                array = np.memmap(self.path, dtype=entry.dtype, mode="c", offset=entry.offset, shape=(count,))
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
            raise CheckpointError(f"{self.where}: {shorten(name)!r} cannot be read: {shorten(str(error))}") from None
        array = array.reshape(entry.shape, order="F" if entry.fortran else "C")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if entry.bf16 else tensor

    def _inflate(self, name: str, entry: Entry, count: int) -> np.ndarray:
        info, header = entry.deflated
        array = np.empty(count, dtype=entry.dtype)
        view = memoryview(array).cast("B")
        with zipfile.ZipFile(self.path) as archive, archive.open(info) as member:
            member.read(header)
            filled = 0
            while filled < len(view):  # never more than the declared size: the array is that big
                got = member.readinto(view[filled:filled + (1 << 24)])
                if not got:
                    raise CheckpointError(f"{self.where}: {shorten(name)!r} holds fewer bytes than its header declares")
                filled += got
        return array


def mapped_file(path: str | os.PathLike) -> MappedFile:
    """The file at `path` (an .npz if it is a zip, else .safetensors), its headers read and checked (module
    docstring)."""
    path = Path(path)
    where = repr(shorten(str(path)))
    try:
        if not path.is_file():
            raise CheckpointError(f"weights file {where} " + ("is not a regular file" if path.exists() else "is missing"))
    except OSError as error:
        raise CheckpointError(f"weights file {where} cannot be opened: {error.strerror or error}") from None
    with open(path, "rb") as file:  # by what it holds: a Hub cache names its blobs by their hash, no suffix
        zipped = file.read(4) == b"PK\x03\x04"
    return _npz(path, where) if zipped or path.suffix == ".npz" else _safetensors(path, where)


def _safetensors(path: Path, where: str) -> MappedFile:
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8).ljust(8, b"\0"), "little")
    if length > MAX_HEADER_BYTES:
        raise CheckpointError(f"weights file {where} has a header of {length:,} bytes; a transcoder's names a few "
                              f"tensors in under {MAX_HEADER_BYTES:,}")
    header = read_safetensors_header(path)  # every offset inside the file, every size its shape's
    with open(path, "rb") as file:
        file.seek(8)
        raw = json.loads(file.read(length))
    entries = {}
    for name, (_, shape) in header.items():
        kind = raw[name]["dtype"]
        if kind not in FLOATS:
            raise CheckpointError(f"weights file {where}: {shorten(name)!r} is {shorten(kind, 20)}, not floating "
                                  f"point (allowed: {', '.join(FLOATS)})")
        entries[name] = Entry(shape, np.dtype(FLOATS[kind]).newbyteorder("<"), 8 + length + raw[name]["data_offsets"][0],
                              bf16=kind == "BF16")
    _check_stored(path, where, sum(entry.nbytes for entry in entries.values()))
    return MappedFile(path, entries)


def _check_stored(path: Path, where: str, declared: int) -> None:
    """CheckpointError when the file holds on disk far fewer bytes than it declares (a sparse file)."""
    blocks = getattr(os.stat(path), "st_blocks", None)
    if blocks is None or declared < SPARSE_FLOOR:
        return
    if blocks * 512 < declared // 2:
        raise CheckpointError(f"weights file {where} declares {declared / 2**30:.2f} GiB of tensors, but only "
                              f"{blocks * 512 / 2**20:.1f} MB of it is stored on disk (a sparse file): a real "
                              "transcoder's weights are stored in full")


# ---- npz -----------------------------------------------------------------------------------------------
def _npz(path: Path, where: str) -> MappedFile:
    _check_directory(path, where)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as error:
        raise CheckpointError(f"{where} is not a readable .npz (zip) file: {shorten(str(error))}") from None
    entries: dict[str, Entry] = {}
    with archive, open(path, "rb") as raw:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if not info.filename.endswith(".npy"):
                continue
            if name in entries:
                raise CheckpointError(f"{where}: the archive holds {shorten(name)!r} twice")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise CheckpointError(f"{where}: {shorten(name)!r} is compressed with method {info.compress_type}; "
                                      "numpy writes stored or deflated members")
            if info.file_size > MAX_RATIO * info.compress_size + MAX_SLACK:
                raise CheckpointError(f"{where}: {shorten(name)!r} declares {info.file_size:,} bytes from "
                                      f"{info.compress_size:,} compressed, more than {MAX_RATIO} times as many (a zip "
                                      "bomb?); real weights barely compress")
            shape, dtype, fortran, header = _npy_header(archive, info, where, name)
            if header + int(np.prod(shape, dtype=np.float64)) * dtype.itemsize != info.file_size:
                raise CheckpointError(f"{where}: {shorten(name)!r} declares shape {shape} of {dtype}, which its "
                                      f"{info.file_size:,} stored bytes do not hold")
            if info.compress_type == zipfile.ZIP_STORED:
                entries[name] = Entry(shape, dtype, _data_start(raw, info, where) + header, fortran)
            else:
                entries[name] = Entry(shape, dtype, fortran=fortran, deflated=(info, header))
    _check_stored(path, where, sum(entry.nbytes for entry in entries.values() if entry.deflated is None))
    return MappedFile(path, entries)


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, name: str):
    """(shape, dtype, fortran order, header bytes) of one .npy member, from its header alone."""
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(member)
            header = member.tell()
    except Exception as error:  # noqa: BLE001 - numpy parses the header (literal_eval: no code runs) in many ways
        raise CheckpointError(f"{where}: the header of {shorten(name)!r} is malformed: {shorten(str(error))}") from None
    if dtype.hasobject or dtype.kind != "f":
        raise CheckpointError(f"{where}: {shorten(name)!r} holds {shorten(str(dtype))}; weights are floating point, "
                              "not numbers of another kind nor objects (nothing is unpickled)")
    return tuple(shape), dtype, fortran, header


def _data_start(raw, info: zipfile.ZipInfo, where: str) -> int:
    """Where a stored member's bytes begin: its local header (30 bytes, then its name and extra field)."""
    raw.seek(info.header_offset)
    local = raw.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{where}: {shorten(info.filename)!r} has no local header where the directory says")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_length + extra_length


def _check_directory(path: Path, where: str) -> None:
    """CheckpointError unless the zip's end record names at most MAX_MEMBERS members in a small central
    directory: zipfile would otherwise build an object for each of a million entries before any check."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        file.seek(max(0, size - 65_557))  # the end record (22 bytes) and a comment of at most 65,535
        tail = file.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            raise CheckpointError(f"{where} is not a readable .npz (zip) file: it has no end of central directory")
        entries, directory = struct.unpack("<HI", tail[at + 10:at + 16])
        if at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":  # zip64: the real counts are in its own record
            file.seek(struct.unpack("<Q", tail[at - 12:at - 4])[0])
            record = file.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                entries, directory = struct.unpack("<QQ", record[32:48])
    if entries > MAX_MEMBERS or directory > MAX_MEMBERS * 1024:
        raise CheckpointError(f"{where} lists {entries:,} members in a {directory:,}-byte directory; a transcoder's "
                              f"npz holds a few arrays (at most {MAX_MEMBERS})")


# ---- what the data holds ----------------------------------------------------------------------------------
def check_finite(tensor: torch.Tensor, where: str) -> None:
    """CheckpointError naming `where` when `tensor` holds a NaN or an infinity; read a block of rows at a time
    (a mapped tensor is paged in once, no [N, M] temporary is made)."""
    if tensor.dim() == 0 or tensor.numel() == 0:
        rows, step = [tensor.reshape(-1)], 1
    else:
        step = max(1, CHUNK_ROWS // max(1, tensor[0].numel()))
        rows = (tensor[start:start + step] for start in range(0, tensor.size(0), step))
    for block in rows:
        if not bool(torch.isfinite(block).all()):
            bad = "NaN" if bool(block.isnan().any()) else "an infinity"
            raise CheckpointError(f"{where} holds {bad}; every weight and threshold must be a finite number")
