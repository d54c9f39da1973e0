"""benchmarks/scale/wmt_mirror.py: the wmt14-en-de-base preset runs against it with one override."""

import tarfile

import pytest
import requests
from helpers.download import run_cli

from transformer.core import presets


@pytest.fixture(scope="module")
def mirror(load_benchmark, shared_data, tmp_path_factory):
    mod = load_benchmark("scale.wmt_mirror")
    root = tmp_path_factory.mktemp("mirror")
    manifest = mod.build(root, pairs=3000, eval_segments={"valid": 40, "test": 43})
    httpd, url = mod.serve(root)
    yield mod, root, url, manifest
    httpd.shutdown()
    httpd.server_close()


def test_archives_have_the_presets_names_and_members(mirror):
    mod, root, _, manifest = mirror
    parts = mod.layout()
    assert (
        {p["url_path"] for p in parts}
        == set(manifest["archives"])
        == {
            "/wmt13/training-parallel-europarl-v7.tgz",
            "/wmt13/training-parallel-commoncrawl.tgz",
            "/wmt14/training-parallel-nc-v9.tgz",
            "/wmt14/dev.tgz",
            "/wmt14/test-full.tgz",
        }
    )
    with tarfile.open(root / "wmt14" / "test-full.tgz") as tar:
        assert sorted(tar.getnames()) == [
            "test-full/newstest2014-deen-ref.de.sgm",
            "test-full/newstest2014-deen-src.en.sgm",
        ]
    sizes = manifest["pairs"]
    assert sum(sizes[n] for n in mod.REAL_PAIRS) == 3000
    assert sizes["commoncrawl"] > sizes["europarl-v7"] > 9 * sizes["news-commentary-v9"]


def test_the_preset_runs_against_the_mirror_with_one_override(mirror, tmp_path):
    url = mirror[2]
    section = presets.preset_params("wmt14-en-de-base")["download"]
    section |= {"mirror": url, "cache_dir": str(tmp_path / "cache")}
    out, m = run_cli(tmp_path, section)
    assert (m["splits"]["valid"]["kept"], m["splits"]["test"]["kept"]) == (40, 43)
    train = m["splits"]["train"]
    assert train["read"] == 3000 and list(train["parts"]) == [
        "europarl-v7",
        "commoncrawl",
        "news-commentary-v9",
    ]
    assert train["dropped"]["duplicate"] > 0 and train["dropped"]["empty"] > 0  # noise
    assert 2700 < train["kept"] < 3000
    assert len((out / "test.de").read_text().split("\n")) == 44


def test_the_server_answers_range_requests(mirror):
    _, root, url, _ = mirror
    data = (root / "wmt14" / "dev.tgz").read_bytes()
    r = requests.get(f"{url}/wmt14/dev.tgz", headers={"Range": "bytes=100-"}, timeout=10)
    assert r.status_code == 206 and r.content == data[100:]
    assert r.headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    r = requests.get(f"{url}/wmt14/dev.tgz", headers={"Range": "bytes=10-19"}, timeout=10)
    assert r.content == data[10:20]
    r = requests.get(f"{url}/wmt14/dev.tgz", headers={"Range": f"bytes={len(data)}-"}, timeout=10)
    assert r.status_code == 416
    assert requests.get(f"{url}/wmt14/dev.tgz", timeout=10).content == data
