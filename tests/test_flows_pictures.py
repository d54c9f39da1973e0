"""What the Prefect UI shows of a run, on the real server with `python -m flows.serve`: the
train stage's progress bar advancing to 100%, the training curves as pictures (the champion's
beside), decisions without `None`; and, where Chromium is installed, the artifact pages in a
headless browser with their images loaded."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import chromium
import pytest
from helpers.curves import line_points
from prefect_fixtures import (
    BIN,
    DVC,
    STARTUP_S,
    artifact,
    client,
    deployment_run,
    find_artifact,
    free_port,
    make_toy,
    run_id,
    served,
    sh,
    stop,
    wait_until,
)

from flows.workspace import WORKSPACE
from transformer.core.curves import read_tsv

DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
DATA_URI = re.compile(r"!\[([^\]]*)\]\(data:(image/[a-z+]+);base64,([A-Za-z0-9+/=]+)\)")


@dataclass
class Runs:
    toy: Path
    first: str  # a retrain with no champion: v1.0.0 (100 steps)
    second: str  # a retrain against it (200 steps): the gate ran
    progress: list[float] = field(default_factory=list)  # the bar as seen during the first


def progress_of(run: str) -> float | None:
    """The train stage's progress artifact of flow run `run` (percent), None before it exists."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterType,
    )

    with client() as c:
        found = c.read_artifacts(
            artifact_filter=ArtifactFilter(
                type=ArtifactFilterType(any_=["progress"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run]),
            )
        )
    return float(found[0].data) if found else None


def state_of(run: str) -> str:
    with client() as c:
        return c.read_flow_run(run).state.type.value


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_server: dict) -> Iterator[Runs]:
    """Two retrains of a served toy project whose train stage takes seconds (TOY_TRAIN_S) and
    whose bar is updated every 0.3 s instead of every minute; the first watched as it runs."""
    toy = make_toy(tmp_path_factory.mktemp("pictures") / "toy")
    sh(*DVC, "remote", "add", "-d", "store", str(toy.parent / "remote"), cwd=toy)
    sh("git", "commit", "-qam", "a DVC remote", cwd=toy)
    env = {
        "TOY_CORPUS": str(toy.parent / "corpus"),
        "TOY_TRAIN_S": "6",
        "FLOWS_PROGRESS_EVERY_S": "0.3",
    }
    with served(toy, prefect_server, **env):
        out = deployment_run(
            prefect_server,
            "retrain/retrain",
            "-p",
            'overrides=["train.max_steps=100"]',
            watch=False,
        )
        first, seen = run_id(out.stdout), []
        deadline = time.monotonic() + 1800
        while state_of(first) not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            assert time.monotonic() < deadline, "the first retrain never ended"
            if (p := progress_of(first)) is not None and (not seen or seen[-1] != p):
                seen.append(p)
            # two reads of the server a poll: twice a second still sees the bar (updated
            # every 0.3 s over the stage's 6 s) a dozen times on its way
            time.sleep(0.5)
        assert state_of(first) == "COMPLETED"
        seen.append(progress_of(first))
        r = deployment_run(
            prefect_server, "retrain/retrain", "-p", 'overrides=["train.max_steps=200"]'
        )
        assert r.returncode == 0, r.stdout + r.stderr
        yield Runs(toy, first, run_id(r.stdout), seen)


def pictures(markdown: str) -> list[tuple[str, str, bytes]]:
    """(alt text, MIME type, bytes) of each data-URI image in an artifact's markdown."""
    return [(alt, mime, base64.b64decode(b64)) for alt, mime, b64 in DATA_URI.findall(markdown)]


def test_the_train_stage_s_progress_advances_to_100(runs: Runs) -> None:
    assert runs.progress[-1] == 100.0
    assert any(0 < p < 100 for p in runs.progress), runs.progress  # seen on the way
    assert runs.progress == sorted(runs.progress)


def test_the_curves_artifact_shows_curves_with_the_champion_s(runs: Runs) -> None:
    text = artifact(runs.second, "training-curves")
    pics = {alt: (mime, blob) for alt, mime, blob in pictures(text)}
    assert set(pics) == {"loss", "quality"}, text[:300]
    mime, svg = pics["loss"]
    assert mime == "image/svg+xml" and svg.startswith(b"<svg")
    rows = read_tsv(runs.toy / WORKSPACE / "data/live/plots/metrics/train/loss.tsv")
    assert len(rows) == 200
    # this run's train loss, every row of its metrics file, and the champion's 100 beside
    assert {200, 100} <= set(line_points(svg.decode(), "train/loss.tsv"))
    assert "champion v1.0.0" in svg.decode() and "this run" in svg.decode()
    assert "cpu_steal" not in text  # a flat curve is no row of the table
    assert "| data/live/plots/metrics/train/loss.tsv | 200 |" in text


def test_decisions_say_what_is_missing_not_none(runs: Runs) -> None:
    first = artifact(runs.first, "retrain-decision")
    assert "None" not in first and "no champion yet" in first
    second = artifact(runs.second, "retrain-decision")
    assert "None" not in second and "| champion before | retrain-" in second
    # (the toy keeps no hypotheses to bootstrap: tests/test_gate.py shows the gate's row)
    assert "- not tested: test:" in second


@pytest.fixture(scope="module")
def ui(prefect_server: dict) -> Iterator[str]:
    """Prefect's UI over the test server's database: a second webserver (no services) with the
    UI on; its URL."""
    port = free_port()
    env = {**prefect_server, "PREFECT_UI_ENABLED": "true"}
    env["PREFECT_UI_API_URL"] = f"http://127.0.0.1:{port}/api"
    env.pop("PREFECT_API_URL", None)
    log = Path(prefect_server["PREFECT_HOME"]) / "ui-server.log"
    cmd = [str(BIN / "prefect"), "server", "start", "--no-services", "--host", "127.0.0.1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status == 200
            except OSError:
                return False

        wait_until("the UI to answer", up, timeout=STARTUP_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def artifact_id(run: str, key: str) -> str:
    return str(find_artifact(run, key).id)


IMAGES = "Array.from(document.images).filter(i => i.src.startsWith('data:'))"


@pytest.mark.skipif(not chromium.found(), reason="no Chromium (Debian: apt-get install chromium)")
def test_the_artifact_pages_show_their_pictures_in_a_browser(runs: Runs, ui: str) -> None:
    """Prefect's UI renders the markdown: each data-URI picture loads (naturalWidth > 0).
    TRANSFORMER_SCREENSHOTS=1 saves each page to docs/img/ (as docs/orchestration.md shows)."""
    pages = [
        (runs.second, "training-curves", 2, "artifact-training-curves.png", 1500),
        (runs.second, "retrain-decision", 0, "artifact-retrain-decision.png", 700),
        (runs.first, "train-progress", 0, "artifact-train-progress.png", 400),
    ]
    with chromium.page(chromium.found()) as tab:
        for run, key, images, shot, height in pages:
            tab.navigate(f"{ui}/artifacts/artifact/{artifact_id(run, key)}")
            if images:
                widths = tab.wait_for(
                    f"the {key} pictures loaded",
                    f"(() => {{ const i = {IMAGES}; return i.length >= {images} && "
                    "i.every(x => x.complete) ? i.map(x => x.naturalWidth) : null; })()",
                )
                assert len(widths) == images and all(w > 0 for w in widths), widths
            else:
                tab.wait_for(f"the {key} artifact", "document.body.innerText.includes('Artifact')")
                time.sleep(1)  # its content renders after the title
            if os.environ.get("TRANSFORMER_SCREENSHOTS"):
                DOCS_IMG.mkdir(parents=True, exist_ok=True)
                (DOCS_IMG / shot).write_bytes(tab.screenshot(height))
