"""`python -m flows.promote`'s command line: a bad project is a clear error, not a traceback;
an experiment is gated in the line its run recorded, or the line its recipe is, or --line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect_fixtures import DVC, git_init, sh

from flows import registry
from flows.promote import line_of

ROOT = Path(__file__).resolve().parents[1]
LINES = """stages: {}
artifacts:
  en-de:
    path: data/package
    meta: {recipe: {preset: demo}}
  de-en:
    path: data/package
    meta: {recipe: {preset: demo-de-en}}
"""


def project(tmp_path: Path, dvc_yaml: str, params: str | None = None) -> Path:
    """A git + DVC project of `dvc_yaml`, this checkout's presets and params.yaml, committed."""
    (tmp_path / "dvc.yaml").write_text(dvc_yaml)
    (tmp_path / "params.yaml").write_text(params or (ROOT / "params.yaml").read_text())
    (tmp_path / "presets").mkdir()
    for name in ("demo", "demo-de-en"):
        (tmp_path / f"presets/{name}.yaml").write_text((ROOT / f"presets/{name}.yaml").read_text())
    git_init(tmp_path)
    sh(*DVC, "init", "-q", cwd=tmp_path)
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-qm", "a project", cwd=tmp_path)
    return tmp_path


def promote_cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.promote", *args, "--project", str(project)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_bad_gate_is_named_before_any_flow_run(tmp_path: Path) -> None:
    """The gate of a line without meta is params.yaml as committed: a bad value is named, with
    the commit, before any flow run starts (no Prefect server is needed to say it)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["retrain"]["margin"] = -1.0
    bad = project(
        tmp_path, "artifacts:\n  transformer:\n    path: data/package\n", yaml.dump(params)
    )
    head = sh("git", "rev-parse", "--short=9", "HEAD", cwd=bad).strip()
    r = promote_cli(bad, "HEAD", "--line", "transformer")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"error: {bad / 'params.yaml'} at {head} (line transformer's gate)" in r.stderr
    assert "retrain.margin must be a number >= 0, got -1.0" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_an_experiment_of_no_line_names_the_lines_and_line(tmp_path: Path) -> None:
    """Run by hand (no recipe in its commit), or a recipe that is no line's: an error listing
    the lines and saying --line, before any flow run starts."""
    two = project(tmp_path, LINES)
    r = promote_cli(two, "HEAD")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "belongs to no line: it was run by hand" in r.stderr, r.stderr
    said = "declares en-de (preset demo); de-en (preset demo-de-en): name one with --line NAME"
    assert said in r.stderr and "(the promote/promote deployment: -p line=NAME)" in r.stderr

    def run_of(preset: str, *overrides: str) -> str:
        """A commit as a flow run saves an experiment: its recipe in the message."""
        recipe = json.dumps({"preset": preset, "overrides": list(overrides)})
        msg = f"Prefect flow run x\n\nrecipe: {recipe}"
        sh("git", "commit", "-q", "--allow-empty", "-m", msg, cwd=two)
        return sh("git", "rev-parse", "HEAD", cwd=two).strip()

    # a flow run from before runs recorded their line: the line its recipe is, at its commit
    assert line_of(two, run_of("demo-de-en", "train.max_steps=9"), None) == "de-en"
    assert line_of(two, run_of("demo"), None) == "en-de"
    assert line_of(two, run_of("demo"), "de-en") == "de-en"  # --line decides
    with pytest.raises(registry.RegistryError) as e:
        line_of(two, run_of("wmt14-en-de-base"), None)
    said = str(e.value)
    assert "its recipe (preset wmt14-en-de-base, overrides none) is no line's" in said, said
    assert "en-de (preset demo); de-en (preset demo-de-en): name one with --line NAME" in said


def test_the_registry_imports_gto_before_any_flow_run() -> None:
    """Importing gto runs logging.config.dictConfig, which flushes every log handler: inside a
    flow run that has logged, Prefect's API handler then waits for its queue (~2.5 s, twice per
    promotion before flows.registry imported gto with itself)."""
    code = "import sys, flows.registry; print('gto.api' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "True", r.stdout + r.stderr
