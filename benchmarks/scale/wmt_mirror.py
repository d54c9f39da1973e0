"""A WMT14 en-de release on 127.0.0.1: the preset's archives, filled with generated text.

    python -m benchmarks.scale.wmt_mirror build /tmp/wmt_mirror  # 4.52M pairs, 0.6 GB, ~3 min
    python -m benchmarks.scale.wmt_mirror serve /tmp/wmt_mirror --port 8000  # until Ctrl-C
    python -m benchmarks.scale.wmt_mirror build /tmp/small --pairs 200000 --serve --port 8000

and in a checkout, the preset with one override pointing every URL at the mirror:

    python -m transformer.config preset wmt14-en-de-base
    dvc exp run -S download.mirror=http://127.0.0.1:8000

The archives' URL paths and member paths are read from presets/wmt14-en-de-base.yaml (e.g.
/wmt13/training-parallel-europarl-v7.tgz with training/europarl-v7.de-en.{en,de},
/wmt14/test-full.tgz with test-full/newstest2014-deen-{src.en,ref.de}.sgm), so the mirror is
exactly what the preset asks statmt.org for. Train parts keep their real relative sizes
(europarl v7 1.92M, commoncrawl 2.40M, news-commentary v9 0.20M pairs of WMT14's 4.52M); the
dev and test sets are SGM files of 3000 and 3003 segments in documents, as the real ones. The
text comes from wmt_corpus (WMT's sentence lengths, a WMT-like vocabulary), with 2% repeated
pairs and 0.5% pairs with an empty side so that the train filters have work. The server
answers HTTP Range requests, which the wmt source uses to resume a partial download.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import tarfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import yaml

from benchmarks.common import ROOT
from benchmarks.scale.wmt_corpus import Corpus

PRESET = ROOT / "presets" / "wmt14-en-de-base.yaml"
# lines of each de-en train part in the real release (wc -l), for their relative sizes
REAL_PAIRS = {"europarl-v7": 1_920_209, "commoncrawl": 2_399_123, "news-commentary-v9": 201_288}
EVAL_SEGMENTS = {"valid": 3000, "test": 3003}  # newstest2013, newstest2014 (full)
DOC_SEGMENTS = 20  # segments per <doc> in the SGM files


def layout(preset: Path = PRESET) -> list[dict]:
    """The preset's parts: [{split, name, format, url_path, members: [en member, de member]}]."""
    download = yaml.safe_load(preset.read_text())["download"]
    langs = (download["src_lang"], download["tgt_lang"])
    parts = []
    for split, specs in download["splits"].items():
        for spec in specs:
            src = spec["src"]
            members = [src.format(lang=langs[0]), (spec.get("tgt") or src).format(lang=langs[1])]
            parts.append(
                {
                    "split": split,
                    "name": spec["name"],
                    "format": spec.get("format", "text"),
                    "url_path": urlparse(spec["path"]).path,
                    "members": members,
                }
            )
    return parts


def part_sizes(parts: list[dict], pairs: int, eval_segments: dict[str, int]) -> dict[str, int]:
    """Pairs per part name: train parts in their real proportions summing to `pairs`."""
    train = [p["name"] for p in parts if p["split"] == "train"]
    unknown = [n for n in train if n not in REAL_PAIRS]
    if unknown:
        raise SystemExit(f"error: no real size known for train part {unknown[0]}")
    total = sum(REAL_PAIRS[n] for n in train)
    sizes = {n: REAL_PAIRS[n] * pairs // total for n in train}
    sizes[train[0]] += pairs - sum(sizes.values())  # the rounding remainder
    sizes.update({p["name"]: eval_segments[p["split"]] for p in parts if p["split"] != "train"})
    return sizes


def _noisy(lines: dict[str, list[str]], rng: np.random.Generator) -> dict[str, list[str]]:
    """2% of pairs a repeat of an earlier pair of the block, 0.5% with one side empty."""
    n = len(lines["en"])
    repeat = np.flatnonzero(rng.random(n) < 0.02)
    empty = np.flatnonzero(rng.random(n) < 0.005)
    for i in repeat[repeat > 0]:
        j = int(rng.integers(0, i))
        lines["en"][i], lines["de"][i] = lines["en"][j], lines["de"][j]
    for i in empty:
        lines["de" if i % 2 else "en"][i] = ""
    return lines


def _sgm(segs: list[str], setid: str, lang: str, side: str) -> str:
    tag = "srcset" if side == "src" else "refset"
    head = f'<{tag} setid="{setid}" srclang="any"' + ("" if side == "src" else f' trglang="{lang}"')
    out = [head + ">"]
    for d in range(0, len(segs), DOC_SEGMENTS):
        sysid = "ref" if side == "ref" else side
        out.append(
            f'<doc sysid="{sysid}" docid="gen-{d // DOC_SEGMENTS}" genre="news" origlang="en">'
        )
        out.append("<p>")
        for i, s in enumerate(segs[d : d + DOC_SEGMENTS], d + 1):
            text = s.replace("<", "&lt;").replace(">", "&gt;")
            out.append(f'<seg id="{i}">{text}</seg>')
        out += ["</p>", "</doc>"]
    out.append(f"</{tag}>")
    return "\n".join(out) + "\n"


def _write_part(part: dict, n: int, corpus: Corpus, rng, staging: Path) -> None:
    """The part's two member files under `staging`, n pairs (segments)."""
    paths = [staging / m for m in part["members"]]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
    if part["format"] == "sgm":
        lines = next(corpus.blocks(n, block=n))
        setid = Path(part["members"][0]).name.split("-")[0]
        for path, lang, side in zip(paths, ("en", "de"), ("src", "ref")):
            path.write_text(_sgm(lines[lang], setid, lang, side), encoding="utf-8")
        return
    with open(paths[0], "w", encoding="utf-8") as fe, open(paths[1], "w", encoding="utf-8") as fd:
        for lines in corpus.blocks(n):
            lines = _noisy(lines, rng)
            fe.write("".join(s + "\n" for s in lines["en"]))
            fd.write("".join(s + "\n" for s in lines["de"]))


def build(
    root: Path,
    pairs: int = sum(REAL_PAIRS.values()),
    seed: int = 0,
    eval_segments: dict[str, int] | None = None,
    preset: Path = PRESET,
) -> dict:
    """Write the preset's archives under root/<url path>, with root/manifest.json; reused when
    the manifest says they were built with the same settings."""
    eval_segments = eval_segments or EVAL_SEGMENTS
    want = {"pairs": pairs, "seed": seed, "eval_segments": eval_segments, "preset": preset.name}
    manifest_path = root / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest["settings"] == want and all(
            (root / a.lstrip("/")).exists() for a in manifest["archives"]
        ):
            return manifest
    parts = layout(preset)
    sizes = part_sizes(parts, pairs, eval_segments)
    # the rare-word pool grows with the corpus: 1.5M words per language at 4.5M pairs
    corpus = Corpus(seed, rare=max(10_000, pairs // 3), wmt_lengths=True)
    rng = np.random.default_rng(seed + 1)
    staging = root / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    t0 = time.perf_counter()
    archives: dict[str, list[str]] = {}
    for part in parts:
        _write_part(part, sizes[part["name"]], corpus, rng, staging)
        archives.setdefault(part["url_path"], []).extend(part["members"])
        print(f"{part['name']}: {sizes[part['name']]} pairs ({time.perf_counter() - t0:.0f} s)")
    out = {}
    for url_path, members in archives.items():
        target = root / url_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        # gzip level 1: the real archives are gzip too, and level 9 would take an hour here
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            for m in members:
                tar.add(staging / m, arcname=m)
        os.replace(tmp, target)
        out[url_path] = {
            "members": members,
            "bytes": target.stat().st_size,
            "sha256": _sha256(target),
        }
        print(
            f"{url_path}: {target.stat().st_size / 2**20:.0f} MiB "
            f"({time.perf_counter() - t0:.0f} s)"
        )
    shutil.rmtree(staging)
    manifest = {
        "settings": want,
        "pairs": sizes,
        "archives": out,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class _Slice:
    """The `n` bytes of an open file from its current position, for a 206 response."""

    def __init__(self, f, n: int):
        self.f, self.left = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.f.read(size)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class RangeHandler(SimpleHTTPRequestHandler):
    """Static files with single-range "Range: bytes=A-[B]" support (206 / 416)."""

    def send_head(self):
        path = self.translate_path(self.path)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start, end = int(m[1]), min(int(m[2] or size - 1), size - 1)
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 - closed by do_GET through _Slice.close
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return _Slice(f, end - start + 1)

    def log_message(self, *args) -> None:
        pass


def serve(root: Path, port: int = 0, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
    """Serve `root` on host:port (0: a free port) from a daemon thread; (server, its URL)."""
    httpd = ThreadingHTTPServer((host, port), partial(RangeHandler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{host}:{httpd.server_address[1]}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the archives (reused when already built alike)")
    b.add_argument("root", type=Path)
    b.add_argument("--pairs", type=int, default=sum(REAL_PAIRS.values()))
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--serve", action="store_true", help="then serve them")
    s = sub.add_parser("serve", help="serve a built mirror on 127.0.0.1")
    s.add_argument("root", type=Path)
    for q in (b, s):
        q.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    if args.cmd == "build":
        m = build(args.root, args.pairs, args.seed)
        print(json.dumps({k: v for k, v in m.items() if k != "archives"}))
    if args.cmd == "serve" or args.serve:
        if not (args.root / "manifest.json").exists():
            raise SystemExit(f"error: {args.root}: no mirror built there (manifest.json)")
        httpd, url = serve(args.root, args.port)
        print(f"serving {args.root} at {url}: set download.mirror={url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            httpd.shutdown()


if __name__ == "__main__":
    main()
