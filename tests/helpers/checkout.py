"""A real pipeline checkout for the real-server flow tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prefect_fixtures import (
    DVC,
    ROOT,
    git_init,
    sh,
)


def checkout(tmp_path: Path, remote: bool = True) -> Path:
    """This checkout's files as a fresh git repository, with a DVC remote (`store`) unless not."""
    project = tmp_path / "checkout"
    project.mkdir()
    files = sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).split()
    tar = subprocess.run(
        ["tar", "-cf", "-", *[f for f in files if (ROOT / f).is_file()]],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-xf", "-"], cwd=project, input=tar, check=True)
    # one model, as before lines (flows/lines.py): the tests of the real pipeline's flows train
    # one recipe, in the project's one run workspace; tests/test_flows_lines.py covers lines
    dvc_yaml = project / "dvc.yaml"
    head = dvc_yaml.read_text().split("\nartifacts:\n")[0]
    dvc_yaml.write_text(
        head + "\nartifacts:\n  transformer:\n    path: data/package\n    type: model\n"
    )
    git_init(project)
    if remote:
        sh(*DVC, "remote", "add", "-d", "store", str(tmp_path / "remote"), cwd=project)
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-qm", "checkout", cwd=project)
    return project
