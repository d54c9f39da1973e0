"""benchmarks/scale/measure.py, the rehearsal's measurements: disk DVC adds, a peak RSS."""

import os
import sys


def test_disk_counts_a_hardlinked_cache_file_once_and_a_copy_twice(load_benchmark, tmp_path):
    bench = load_benchmark("scale.measure")
    (tmp_path / "data").mkdir()
    cache = tmp_path / ".dvc" / "cache" / "files"
    cache.mkdir(parents=True)
    (tmp_path / "data" / "linked").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "data" / "linked", cache / "aa")
    (tmp_path / "data" / "copied").write_bytes(b"y" * 200_000)
    (cache / "bb").write_bytes(b"y" * 200_000)
    d = bench.disk(tmp_path)
    assert d["workspace"] >= 300_000 and d["dvc_cache"] >= 300_000
    assert 200_000 <= d["dvc_extra"] < 300_000  # the copy only
    assert d["download_cache"] == 0


def test_run_measures_the_commands_peak_rss_and_dvcs_share_of_its_time(load_benchmark, tmp_path):
    bench = load_benchmark("scale.measure")
    child = (
        "import subprocess, sys; print(\"Running stage 'x':\", flush=True); "
        "subprocess.run([sys.executable, '-c', 'import time; b = bytearray(300 << 20); "
        "time.sleep(1.0); print(len(b))'], check=True); "
        "import time; time.sleep(0.5); print(\"Updating lock file 'dvc.lock'\")"
    )
    r = bench.Run([sys.executable, "-c", child], tmp_path, tmp_path / "log")
    assert r.stage_rss >= 300 << 20 and r.tree_peak >= r.stage_rss  # the grandchild's bytes
    # DVC's share: up to the stage's first line, and from the command's last line on (its
    # grandchild's print, not the lock line); orderings, not durations (no timed assertions)
    before, after = r.dvc_overhead()
    output = r.at("314572800")
    assert before == r.at("Running stage 'x'") and 0 <= before < output < r.wall
    assert after == r.wall - output
    assert "314572800" in (tmp_path / "log").read_text()
