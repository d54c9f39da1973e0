"""WMT release files: resumable HTTP(S) downloads, sha256 checks, safe tarball extraction.

A download goes to NAME.part and is renamed to NAME only when complete and verified, so a
final name always means a whole file. An interrupted download resumes from the byte it had
(HTTP Range). Extraction writes only the regular-file members asked for, each atomically,
and refuses links and paths that would leave the target folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse, urlunparse

import requests
import urllib3
from tqdm import tqdm

from transformer.core.files import atomic_write, sha256_file

log = logging.getLogger("transformer.download")
ARCHIVES = (".tgz", ".tar.gz", ".tar", ".tar.bz2", ".tar.xz")


class SourceError(RuntimeError):
    """A bad source: missing file, failed download, corrupt archive, misaligned files."""


class _Transient(Exception):
    """A failure worth retrying: 5xx / 429, dropped connection, short body."""


def is_url(where: str) -> bool:
    return urlparse(where).scheme in ("http", "https")


def mirrored(url: str, mirror: str) -> str:
    """`url` on `mirror`: its scheme and host replaced by the mirror's, the mirror's path (if
    any) put before its own, e.g. https://www.statmt.org/wmt14/dev.tgz on http://127.0.0.1:8000
    is http://127.0.0.1:8000/wmt14/dev.tgz."""
    u, m = urlparse(url), urlparse(mirror)
    return urlunparse(
        u._replace(scheme=m.scheme, netloc=m.netloc, path=m.path.rstrip("/") + u.path)
    )


def is_archive(where: str) -> bool:
    return urlparse(where).path.lower().endswith(ARCHIVES) if where else False


def verify(path: Path, sha256: str, what: str) -> None:
    got = sha256_file(path)
    if got != sha256.lower():
        raise SourceError(f"{what}: sha256 mismatch: expected {sha256}, got {got}")


def fetch(
    url: str,
    cache: Path,
    sha256: str = "",
    retries: int = 5,
    backoff: float = 2.0,
    timeout: float = 60.0,
) -> Path:
    """Download `url` into `cache`, resuming a .part file; the local path. A cached copy is kept
    if it matches `sha256`, or, without one, if the server says it has not changed since (its
    ETag / Last-Modified): a source that moves is fetched again, as retraining needs."""
    name = PurePosixPath(urlparse(url).path).name or "index"
    # the URL's hash keeps same-named files from different hosts apart
    dest = cache / f"{hashlib.sha256(url.encode()).hexdigest()[:8]}-{name}"
    part = dest.with_name(dest.name + ".part")
    if dest.exists():
        if sha256 and sha256_file(dest) == sha256.lower():
            return dest
        if not sha256 and not _changed(url, dest, retries, backoff, timeout):
            return dest
        log.warning(
            "%s: the cached %s %s; downloading it again",
            url,
            dest,
            f"does not match sha256 {sha256}" if sha256 else "changed upstream",
        )
        dest.unlink()
        part.unlink(missing_ok=True)  # a part of the old version cannot continue into the new
    cache.mkdir(parents=True, exist_ok=True)
    validators = _retrying(url, retries, backoff, lambda: _get(url, part, timeout), part)
    if sha256:
        try:
            verify(part, sha256, url)
        except SourceError as e:
            part.unlink()  # a whole but wrong file cannot be resumed into a right one
            raise SourceError(f"{e}; the download was removed") from None
    os.replace(part, dest)
    _validators_file(dest).write_text(json.dumps(validators))
    return dest


def _retrying(url: str, retries: int, backoff: float, attempt, part: Path | None = None):
    """attempt()'s result, retried on _Transient with exponential backoff; SourceError at last."""
    for n in range(retries + 1):
        try:
            return attempt()
        except _Transient as e:
            if n == retries:
                kept = (
                    f"{part} keeps what arrived and the next run resumes it"
                    if part and part.exists() and part.stat().st_size
                    else "nothing arrived"
                )
                raise SourceError(
                    f"{url}: download failed after {retries + 1} attempts ({e}); {kept}"
                ) from None
            wait = backoff * 2**n
            log.warning("%s: %s; retrying in %.1f s (%d/%d)", url, e, wait, n + 1, retries)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _validators_file(dest: Path) -> Path:
    return dest.with_name(dest.name + ".validators.json")


def _changed(url: str, dest: Path, retries: int, backoff: float, timeout: float) -> bool:
    """Whether the server has a newer `url` than the cached `dest` (a conditional request on
    the ETag / Last-Modified it gave). Without validators, or when the server cannot be
    reached, the cached copy stands (with a warning in the latter case)."""
    try:
        saved = json.loads(_validators_file(dest).read_text())
    except (OSError, ValueError):
        return False
    headers = {
        k: v
        for k, v in (
            ("If-None-Match", saved.get("etag")),
            ("If-Modified-Since", saved.get("last_modified")),
        )
        if v
    }
    if not headers:
        return False

    def attempt() -> bool:
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as r:
                if r.status_code >= 500 or r.status_code == 429:
                    raise _Transient(f"HTTP {r.status_code} {r.reason}")
                return r.status_code != 304  # the body of a 200 is not read here
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
            raise _Transient(type(e).__name__) from None

    try:
        return _retrying(url, retries, backoff, attempt)
    except SourceError as e:
        log.warning("%s; could not check whether %s changed: the cached copy is used", e, url)
        return False


def _get(url: str, part: Path, timeout: float) -> dict[str, str | None]:
    """One attempt: append to `part` from where it stops; the response's validators (ETag,
    Last-Modified); _Transient on a retryable failure."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        with requests.get(url, headers=headers, stream=True, timeout=timeout) as r:
            validators = {
                "etag": r.headers.get("ETag"),
                "last_modified": r.headers.get("Last-Modified"),
            }
            if r.status_code == 416 and have:  # nothing after byte `have`: already complete
                return validators
            if r.status_code >= 500 or r.status_code == 429:
                raise _Transient(f"HTTP {r.status_code} {r.reason}")
            if r.status_code >= 400:
                raise SourceError(f"{url}: HTTP {r.status_code} {r.reason}")
            if r.status_code != 206 or not r.headers.get("Content-Range", "").startswith(
                f"bytes {have}-"
            ):
                have = 0  # the server sent the whole file, not the rest: start over
            size = int(r.headers.get("Content-Length", 0))
            with (
                open(part, "ab" if have else "wb") as f,
                tqdm(
                    total=have + size or None,
                    initial=have,
                    unit="B",
                    unit_scale=True,
                    desc=part.name.removesuffix(".part"),
                    leave=False,
                    mininterval=1.0,
                ) as bar,
            ):
                # read1 hands over whatever arrived, so a dropped connection loses no byte
                # that reached us (iter_content would discard a partly filled block)
                while block := r.raw.read1(1 << 16):
                    f.write(block)
                    bar.update(len(block))
            if size and part.stat().st_size != have + size:
                raise _Transient(f"short body: {part.stat().st_size - have} of {size} bytes")
            return validators
    except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
        raise _Transient(type(e).__name__) from None


def extraction_dir(archive: Path, root: Path) -> Path:
    """Where `archive`'s members go under `root`: a folder per archive file and version, so a
    replaced or re-downloaded archive of the same name is extracted afresh, never mixed."""
    st = archive.stat()
    key = f"{archive.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return root / f"{archive.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def extract(archive: Path, members: list[str], dest: Path) -> list[Path]:
    """Extract `members` (regular files only) of a tar archive into `dest`; their paths."""
    out = [_safe_target(dest, m, archive) for m in members]
    wanted = {m: p for m, p in zip(members, out) if not p.exists()}
    if not wanted:
        return out
    try:
        with tarfile.open(archive, "r:*") as tar:
            for info in tar:  # one sequential pass: gzip streams cannot seek cheaply
                target = wanted.pop(info.name.removeprefix("./"), None)
                if target is None:
                    continue
                if not info.isfile():
                    raise SourceError(
                        f"{archive}: member {info.name} is a link or special "
                        "file; refusing to extract it"
                    )
                with tar.extractfile(info) as src, atomic_write(target) as f:
                    while block := src.read(1 << 20):
                        f.write(block)
                if not wanted:
                    break
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise SourceError(
            f"{archive}: truncated or corrupt archive ({e}); delete it to download again"
        ) from None
    if wanted:
        raise SourceError(
            f"{archive}: no member {next(iter(wanted))} "
            f"(members: {', '.join(_names(archive)[:20])})"
        )
    version = re.compile(rf"{re.escape(archive.name)}-[0-9a-f]{{12}}")
    if version.fullmatch(dest.name):  # an extraction_dir: its earlier versions are stale
        for older in dest.parent.iterdir():
            if older != dest and older.is_dir() and version.fullmatch(older.name):
                shutil.rmtree(older)
    return out


def _safe_target(dest: Path, member: str, archive: Path) -> Path:
    p = PurePosixPath(member)
    if p.is_absolute() or ".." in p.parts or not member:
        raise SourceError(f"{archive}: unsafe member path {member!r}")
    return dest.joinpath(*p.parts)


def _names(archive: Path) -> list[str]:
    with tarfile.open(archive, "r:*") as tar:
        return [m.name for m in tar if m.isfile()]
