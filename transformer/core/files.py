"""Small file helpers shared by the stages: atomic writes, content hashes, text lines."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb", **kwargs) -> Iterator[IO]:
    """Write to a temporary file beside `path`, renamed over it only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the final file gets normal modes
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def remove_partial_writes(folder: Path, name_glob: str) -> None:
    """Delete what atomic_write left of files named `name_glob` in `folder` when its process was
    killed mid-write: the temporary files, which nothing else would ever remove."""
    for tmp in Path(folder).glob(f".{name_glob}.*.tmp"):  # atomic_write's temporary names
        tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Build a directory under a temporary name; it replaces `path` only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; the final folder gets normal modes
    try:
        yield tmp
        old = path.with_name(f".{path.name}.old")
        _rmtree(old)  # a stale one too: a run killed between the two renames left it
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        _rmtree(old)
    finally:
        _rmtree(tmp)


def _rmtree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def write_json(path: Path, obj, indent: int = 2) -> None:
    """`obj` as JSON at `path`, atomically (metrics, manifests, indexes)."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def count_lines(path: Path) -> int:
    """The newline-ended lines of a file, counted in blocks (no decoding)."""
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def read_lines(path: Path | None, error: type[Exception] = ValueError) -> list[str]:
    """The newline-ended lines of a UTF-8 file (stdin if None), one sentence each; `error`
    names the file and the line that is not UTF-8. Not str.splitlines: it also ends lines at
    U+2028, form feeds, U+0085 ..., and a translation's lines would not line up with its input."""
    where = path or "<stdin>"
    try:
        data = sys.stdin.buffer.read() if path is None else Path(path).read_bytes()
    except OSError as e:
        raise error(f"{where}: cannot read ({e})") from None
    return split_lines(data, where, error)


def split_lines(data: bytes, where: object, error: type[Exception] = ValueError) -> list[str]:
    """read_lines of bytes already read (`where` names them in an error)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the last line's newline, or an empty input
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(line.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError:
            raise error(f"{where}: line {n}: not UTF-8") from None
    return out
