"""Reading checkpoints without running their code.

A pickle can call any Python function while it is read. We only read formats that cannot: safetensors,
`torch.load(weights_only=True)` (PyTorch's restricted unpickler: tensors, dicts, lists, numbers, strings) and
`np.load(allow_pickle=False)`. Anything else is refused with an `UnsafeCheckpointError` naming the file.
"""

from __future__ import annotations

import pickle
import pickletools
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .report import WeightsError


class UnsafeCheckpointError(WeightsError):
    """A checkpoint that would need arbitrary code to be run to read it; it was not read."""


# What torch.load / np.load raise on a damaged or foreign file, besides their own error types: their parsers index,
# decode and unpack the file's bytes directly (a truncated zip, a flipped bit in a pickle opcode or length).
_PARSE_ERRORS: tuple[type[Exception], ...] = (
    RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, EOFError, UnicodeDecodeError,
    struct.error, zipfile.BadZipFile, zlib.error, OverflowError, MemoryError, RecursionError, NotImplementedError,
    AssertionError, pickle.UnpicklingError,
)
_READ_ERRORS: tuple[type[Exception], ...] = (OSError, *_PARSE_ERRORS)
# OSErrors that are about reaching the file, not about its contents: they keep their type (the CLI names them).
_ACCESS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# The weights-only unpickler's refusals that mean "this pickle asks to import, call or build something".
_CODE_RUNNING = re.compile(r"GLOBAL|Can only create new object|Can only build|call reduce|unrecognized function",
                           re.IGNORECASE)


def torch_load(path: str | Path) -> Any:
    """`torch.load` restricted to plain data (tensors and containers); refuses anything that runs code.

    Raises:
        UnsafeCheckpointError: the pickle references a function or class outside PyTorch's allow-list.
        WeightsError: not a PyTorch checkpoint (the message says what the file looks like) or a damaged one.
    """
    path = Path(path)
    kind = sniff(path)
    if kind.name not in ("torch_zip", "pickle", "badzip"):
        raise WeightsError(f"{path}: not a PyTorch checkpoint: looks like {kind.description}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except _ACCESS_ERRORS:
        raise
    except pickle.UnpicklingError as e:
        # PyTorch's unpickler stops at opcodes it does not know (protocol 4's FRAME) before it sees any global:
        # then we look for the globals the stream imports ourselves
        culprit = _culprit(e) if _CODE_RUNNING.search(str(e)) else _foreign_global(path) if kind.name == "pickle" \
            else None
        if culprit is None and kind.description in ("a pickle (protocol 4)", "a pickle (protocol 5)"):
            raise WeightsError(f"{path}: not a PyTorch checkpoint: {kind.description} written by pickle, which "
                               "torch.load(weights_only=True) does not read; save the state dict with torch.save(...) "
                               "or as .safetensors") from e
        if culprit is None:
            raise WeightsError(f"{path}: damaged PyTorch checkpoint ({kind.description}): {_culprit(e)}") from e
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it is a pickle that asks to run code or build objects other than tensors "
            f"({culprit}). Only plain state dicts are read (torch.load(weights_only=True)); if you trust the "
            f"file, re-save its state dict with torch.save(model.state_dict(), ...) or as .safetensors"
        ) from None
    except _READ_ERRORS as e:
        raise WeightsError(f"{path}: damaged PyTorch checkpoint ({kind.description}): "
                           f"{type(e).__name__}: {_first_line(e)}") from e


def np_load(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz (or one .npy) with pickles disabled, so object arrays are refused.

    Raises:
        UnsafeCheckpointError: the archive holds pickled Python objects.
        WeightsError: not a NumPy archive (the message says what the file looks like) or a damaged one.
    """
    path = Path(path)
    kind = sniff(path)
    if kind.name not in ("npz", "badzip"):  # e.g. a PyTorch checkpoint renamed .npz, a text file, one .npy
        raise WeightsError(f"{path}: not a NumPy archive: looks like {kind.description}")
    try:
        # the file is ours to close: np.load leaks the one it opened itself when the zip is damaged
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except _ACCESS_ERRORS:
        raise
    except ValueError as e:
        if "allow_pickle" in str(e) or "pickle" in str(e).lower():
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it holds pickled Python objects, which can run code; "
                "official Google .npz checkpoints hold plain arrays only"
            ) from None
        raise WeightsError(f"{path}: damaged NumPy archive: {_first_line(e)}") from e
    except _READ_ERRORS as e:
        raise WeightsError(f"{path}: damaged NumPy archive: {type(e).__name__}: {_first_line(e)}") from e


@dataclass(frozen=True)
class Kind:
    """What a file's first bytes say it is: a short name, and a phrase for messages ("a PNG image")."""

    name: str
    description: str


_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png", "a PNG image"),
    (b"\xff\xd8\xff", "jpeg", "a JPEG image"),
    (b"GIF87a", "gif", "a GIF image"),
    (b"GIF89a", "gif", "a GIF image"),
    (b"\x1f\x8b", "gzip", "a gzip-compressed file (decompress it first)"),
    (b"BZh", "bzip2", "a bzip2-compressed file (decompress it first)"),
    (b"\xfd7zXZ\x00", "xz", "an xz-compressed file (decompress it first)"),
    (b"\x89HDF\r\n\x1a\n", "hdf5", "an HDF5 file (Keras .h5?)"),
    (b"\x93NUMPY", "npy", "a single NumPy .npy array (a checkpoint is an .npz of named arrays)"),
    (b"%PDF", "pdf", "a PDF document"),
)


def sniff(path: str | Path) -> Kind:
    """Tell what a file is from its first bytes (and, for a zip, its member names), without parsing it.

    Used to name what a file actually is when it is not what its suffix says ("x.npz: not a NumPy archive:
    looks like a text file (first line: 'hello')"), instead of reporting a parser's error.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4096)
        size = f.seek(0, 2)
    if not head:
        return Kind("empty", "an empty file (0 bytes)")
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _sniff_zip(path)
    for magic, name, description in _MAGIC:
        if head.startswith(magic):
            return Kind(name, description)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return Kind("webp", "a WebP image")
    if len(head) > 262 and head[257:262] == b"ustar":
        return Kind("tar", "a tar archive (a WebDataset shard?)")
    if head[0] == 0x80 and 2 <= (head[1:2] or b"\x00")[0] <= 5:
        legacy = head[2:3] == b"\x8a"  # torch's legacy format starts with the pickled magic number, a LONG1
        return Kind("pickle", "a legacy PyTorch checkpoint (a pickle stream)" if legacy else
                    f"a pickle (protocol {head[1]})")
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 2 <= n <= size - 8:
            return Kind("safetensors", "a .safetensors file")
    text = _as_text(head)
    if text is not None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        shown = repr(first[:60] + ("..." if len(first) > 60 else ""))
        lower = text.lstrip().lower()
        if lower.startswith(("<!doctype html", "<html")) or "<html" in lower[:1000]:
            return Kind("html", f"an HTML page (a download that returned a web page?), first line: {shown}")
        if lower.startswith(("{", "[")):
            return Kind("json", f"a JSON text file (first line: {shown})")
        if re.match(r"(---|[\w.-]+:(\s|$))", text.lstrip()):
            return Kind("yaml", f"a YAML text file (first line: {shown})")
        return Kind("text", f"a text file (first line: {shown})")
    return Kind("unknown", f"no known format (first bytes: {head[:8].hex(' ')})")


def _sniff_zip(path: Path) -> Kind:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except _READ_ERRORS:
        return Kind("badzip", "a damaged zip archive")
    if names and all(n.endswith(".npy") for n in names):
        return Kind("npz", "a NumPy .npz archive")
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return Kind("torch_zip", "a PyTorch zip checkpoint")
    return Kind("zip", f"a zip archive of {len(names)} file(s) that is neither a NumPy .npz nor a PyTorch "
                f"checkpoint (first: {names[:3]})")


def _as_text(head: bytes) -> str | None:
    """`head` decoded as UTF-8 text (a character cut at the end is allowed), or None for binary data."""
    if b"\x00" in head:
        return None
    for cut in range(4):
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if all(c.isprintable() or c in "\t\r\n\f" for c in text):
            return text
        return None
    return None


# Globals a plain PyTorch state dict's pickle imports (PyTorch's own allow-list covers these and more).
_PLAIN_GLOBALS = re.compile(r"(torch(\.|$).*|collections\.OrderedDict|_codecs\.encode|builtins\.(set|frozenset|"
                            r"bytearray|complex|slice|range))")


def _foreign_global(path: Path) -> str | None:
    """"GLOBAL module.name" for the first global a pickle stream imports that a state dict does not need (a
    function to call, a class to build), read with pickletools without executing anything; None if none."""
    strings: list[str] = []
    with open(path, "rb") as f:
        try:
            for op, arg, _ in pickletools.genops(f):
                if op.name in ("GLOBAL", "INST") and isinstance(arg, str):
                    name = arg.replace(" ", ".")
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    name = f"{strings[-2]}.{strings[-1]}"
                else:
                    if isinstance(arg, str):
                        strings.append(arg)
                    continue
                if not _PLAIN_GLOBALS.fullmatch(name):
                    return f"Unsupported global: GLOBAL {name}"
        except (ValueError, EOFError, UnicodeDecodeError, struct.error, KeyError, IndexError, OverflowError):
            pass  # damaged further on: what was read so far decides
    return None


def _culprit(e: BaseException) -> str:
    """The line of PyTorch's refusal that names the offending global (e.g. "Unsupported global: GLOBAL io.open")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # PyTorch colours its message
    m = re.search(r"Unsupported global: GLOBAL \S+", text)
    if m:
        return m.group(0)
    for line in text.splitlines():
        if "Unsupported" in line:
            return line.strip().rstrip(".")
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
