"""Several lines in the toy project (tests/prefect_fixtures.py): their declaration in dvc.yaml,
the registry's tags, and the flows' command lines run in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prefect_fixtures import sh

# a toy line's data and model as `-S` overrides: the demo's corpus at 300 pairs, a 1-layer
# d_model 32 model (tests that run a whole line through the flows add their steps)
TINY_MODEL = [
    "download.synthetic.train=300",
    "download.synthetic.valid=20",
    "download.synthetic.test=20",
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_layers=1",
]

LINES = """artifacts:
  en-de:
    path: data/package
    type: model
    meta: {recipe: {preset: demo}, schedule: null, uses: {backward: {line: de-en}}}
  de-en:
    path: data/package
    type: model
    meta:
      recipe:
        preset: demo
        overrides: [train.max_steps=500, download.src_lang=de, download.tgt_lang=en]
      schedule: {cron: "0 4 * * 1", timezone: UTC}
      retrain: {margin: 0.5}
      uses: {backward: {line: en-de}}
"""
# the other lines' champions a run uses (issue 81): the toy's helpers stage records what the
# flows fetched into data/helpers, which the toy tokenizer then depends on (as the real score
# stage does)
HELPERS = """  helpers:
    cmd: python toy.py helpers
    deps: [toy.py]
    params: [helpers]
    outs: [{data/helpers: {persist: true}}]
    metrics: [data/metrics/helpers.json]
  tokenizer:
    cmd: python toy.py tokenizer
    deps: [data/raw, data/helpers, toy.py]
"""


def declare(toy: Path, artifacts: str) -> None:
    text = (toy / "dvc.yaml").read_text()
    if "uses:" in artifacts:
        old = "  tokenizer:\n    cmd: python toy.py tokenizer\n    deps: [data/raw, toy.py]\n"
        text = text.replace(old, HELPERS)
    (toy / "dvc.yaml").write_text(text.split("artifacts:")[0] + artifacts)
    sh("git", "commit", "-qam", "the lines", cwd=toy)


def tags(repo: Path, *patterns: str) -> dict[str, str]:
    """{tag: the commit it points at}."""
    out = sh(
        "git",
        "for-each-ref",
        "--format=%(refname:short) %(*objectname)%(objectname)",
        *(f"refs/tags/{p}" for p in patterns),
        cwd=repo,
    )
    return dict(line.split(" ", 1) for line in out.splitlines())


def python(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
