"""The download stage's test tools: the CLI, local sources, a WMT-like HTTP server, a hub replica."""

import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from transformer import download


def run_cli(tmp_path, download_section: dict) -> tuple[Path, dict]:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"download": download_section}))
    out, manifest = tmp_path / "raw", tmp_path / "download.json"
    download.main([str(out), "--manifest", str(manifest), "--params", str(params)])
    return out, json.loads(manifest.read_text())


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def local(tmp_path, **splits) -> dict:
    return {"source": "local", "cache_dir": str(tmp_path / "cache"), "splits": splits}


SGM = """<srcset setid="newstest2013" srclang="any">
<doc sysid="ref" docid="a" genre="news" origlang="en">
<p>
<seg id="1">A  first  sentence.</seg>
<seg id="2">Second &amp; last.</seg>
</p>
</doc>
</srcset>
"""


def tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


NC_EN = "".join(f"news sentence number {i} here\n" for i in range(3000)).encode()


NC_DE = "".join(f"Nachrichtensatz Nummer {i} hier\n" for i in range(3000)).encode()


TGZ = tarball(
    {
        "training/nc-v9.de-en.en": NC_EN,
        "training/nc-v9.de-en.de": NC_DE,
        "dev/newstest2013-src.en.sgm": SGM.encode(),
        "dev/newstest2013-ref.de.sgm": SGM.replace("first", "erster").encode(),
    }
)


class Server:
    """WMT-like files on 127.0.0.1 with Range support and scripted faults per path."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.faults, self.ranges = files, {}, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.ranges.append((self.path, self.headers.get("Range")))
                data = server.files.get(self.path)
                fault = (server.faults.get(self.path) or [None]).pop(0) if data else None
                if data is None:
                    return self.send_error(404)
                if fault == "500":
                    return self.send_error(500)
                start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if fault == "drop":  # half the body, then the connection goes away
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def wmt_cfg(tmp_path, url, sha="", retries=3) -> dict:
    part = lambda **kw: {"path": f"{url}/wmt14/nc.tgz", "sha256": sha, **kw}
    return {
        "source": "wmt",
        "cache_dir": str(tmp_path / "cache"),
        "retries": retries,
        "backoff": 0.01,
        "timeout": 5.0,
        "splits": {
            "train": [part(src="training/nc-v9.de-en.{lang}")],
            "valid": [
                part(
                    src="dev/newstest2013-src.en.sgm",
                    tgt="dev/newstest2013-ref.de.sgm",
                    format="sgm",
                )
            ],
            "test": [
                part(
                    src="dev/newstest2013-src.en.sgm",
                    tgt="dev/newstest2013-ref.de.sgm",
                    format="sgm",
                )
            ],
        },
    }


def hub_replica(root: Path) -> Path:
    """A folder laid out like the wmt/wmt14 Hub repo: README configs + parquet per split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "de-en").mkdir(parents=True)
    for split, n in (("train", 50), ("validation", 5), ("test", 6)):
        rows = [{"de": f"{split} Satz {i}", "en": f"{split} sentence {i}"} for i in range(n)]
        pq.write_table(
            pa.table({"translation": rows}), root / "de-en" / f"{split}-00000-of-00001.parquet"
        )
    card = {
        "configs": [
            {
                "config_name": "de-en",
                "data_files": [
                    {"split": s, "path": f"de-en/{s}-*"} for s in ("train", "validation", "test")
                ],
            }
        ]
    }
    write(root / "README.md", f"---\n{yaml.safe_dump(card)}---\n# replica\n")
    return root
