"""One registry for a team: two clones of one bare origin, sharing one DVC remote, decide as two
machines would (real git, dvc, GTO and a Prefect server on 127.0.0.1, on the toy project).

Both promote a better experiment of one line at the same moment: git pre-push hooks hold each
clone's push until both have decided "no champion yet" (the race), and the first push wins. The
other's atomic push is refused; it decides again against the new champion, from origin's view.
Then the DVC remote refuses (its directory replaced by a file): no production tag anywhere, the
decision says why, and `flows.registry publish` completes it once the remote is back. An origin
that cannot be reached, or that holds a tag this clone holds otherwise, decides nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prefect_fixtures import DVC, client, make_toy, sh

LINE = """artifacts:
  en-de:
    path: data/package
    type: model
    meta: {recipe: {preset: demo}, schedule: null, retrain: {margin: 0.5}}
"""

# Each clone's pre-push hook: `a` waits until `b` has decided too; `b` waits until origin holds
# a's first version, so a wins the race and b's first push is refused. Bounded: never hangs.
HOOK = """#!/bin/sh
touch "{barrier}/{me}"
i=0
while [ $i -lt 600 ]; do
  {ready} && exit 0
  sleep 0.1; i=$((i+1))
done
exit 0
"""
READY = {
    "a": '[ -e "{barrier}/b" ]',
    "b": "git ls-remote --tags origin | grep -q 'en-de@v1.0.0'",
}


def python(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ran(args: list[str], cwd: Path, env: dict) -> tuple[int, str]:
    proc = python(args, cwd, env)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def tags(repo: Path) -> dict[str, str]:
    """{tag: the commit it points at} of the line's registry tags."""
    out = sh(
        "git",
        "for-each-ref",
        "--format=%(refname:short) %(*objectname)%(objectname)",
        "refs/tags/en-de*",
        "refs/tags/decision",
        cwd=repo,
    )
    return {t: c[:40] for t, c in (line.split(" ", 1) for line in out.splitlines())}


def experiment(clone: Path, name: str, steps: int, env: dict) -> str:
    sh(*DVC, "exp", "run", "-q", "-n", name, "-S", f"train.max_steps={steps}", cwd=clone, env=env)
    refs = sh("git", "for-each-ref", "refs/exps", "--format=%(objectname) %(refname)", cwd=clone)
    (commit,) = [c for c, ref in (x.split() for x in refs.splitlines()) if ref.endswith(name)]
    return commit


def fetched(bare: Path, dest: Path, *where: str) -> str:
    """The package's model.pt as a fresh clone of origin fetches it (`dvc artifacts get`)."""
    sh("git", "clone", "-q", str(bare), str(dest), cwd=dest.parent)
    sh(*DVC, "artifacts", "get", ".", "en-de", *where, "-o", "got", "--remote", "store", cwd=dest)
    return (dest / "got" / "model.pt").read_text().split()[0]


def gto_show(repo: Path) -> list:
    import gto.api

    return sorted(
        (v["version"], v["commit_hexsha"], tuple(sorted(v["stages"])))
        for v in gto.api.show(str(repo), "en-de", table=False)
    )


@pytest.mark.slow
def test_two_machines_one_registry(prefect_server: dict, tmp_path: Path) -> None:
    toy = make_toy(tmp_path / "toy")
    text = (toy / "dvc.yaml").read_text()
    (toy / "dvc.yaml").write_text(text.split("artifacts:")[0] + LINE)
    bare, store = tmp_path / "team.git", tmp_path / "store"
    sh("git", "init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(bare), cwd=toy)
    sh(*DVC, "remote", "add", "-d", "store", str(store), cwd=toy)
    sh("git", "commit", "-qam", "the line and the DVC remote", cwd=toy)
    sh("git", "push", "-q", "origin", "main", cwd=toy)
    env = {**prefect_server, "TOY_CORPUS": str(tmp_path / "corpus"), "PYTHONPATH": ""}
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    clones, commits = {}, {}
    for me, steps in (("a", 700), ("b", 800)):
        clone = clones[me] = tmp_path / me
        sh("git", "clone", "-q", str(bare), str(clone), cwd=tmp_path)
        commits[me] = experiment(clone, me, steps, env)
        hook = clone / ".git/hooks/pre-push"
        hook.write_text(
            HOOK.format(barrier=barrier, me=me, ready=READY[me].format(barrier=barrier))
        )
        hook.chmod(0o755)

    # the race: both decide at once; a's push lands first, b decides again against a's champion
    procs = {
        me: python(["-m", "flows.promote", me, "--line", "en-de"], clones[me], env)
        for me in ("a", "b")
    }
    outs = {me: p.communicate(timeout=600)[0] for me, p in procs.items()}
    assert procs["a"].returncode == 0, outs["a"]
    assert "promoted as v1.0.0: no champion yet" in outs["a"]
    assert procs["b"].returncode == 0, outs["b"]
    assert "deciding again" in outs["b"] and "promoted as v2.0.0" in outs["b"], outs["b"]
    origin = tags(bare)
    assert origin["en-de@v1.0.0"] == commits["a"] and origin["en-de@v2.0.0"] == commits["b"]
    assert {t for t in origin if "#" in t} == {"en-de#prod#1", "en-de#prod#2"}
    assert origin["decision/en-de/0001"] == commits["a"]
    assert origin["decision/en-de/0002"] == commits["b"]
    for me in ("a", "b"):  # nothing left behind locally that origin does not hold
        assert tags(clones[me]).items() <= origin.items()
    # each production tag's package fetchable from a fresh clone
    assert fetched(bare, tmp_path / "fresh1", "--rev", "v1.0.0") == "700"
    assert fetched(bare, tmp_path / "fresh2", "--stage", "prod") == "800"
    for me in ("a", "b"):
        sh("git", "fetch", "-q", "origin", "refs/tags/*:refs/tags/*", cwd=clones[me])
    assert gto_show(clones["a"]) == gto_show(clones["b"]) == gto_show(tmp_path / "fresh1")

    # the DVC remote refuses: no production tag anywhere; publish completes it once it is back
    commits["c"] = experiment(clones["b"], "c", 900, env)  # b holds the champion's records
    store.rename(tmp_path / "store.away")
    store.write_text("not a directory\n")
    code, out = ran(["-m", "flows.promote", "c", "--line", "en-de"], clones["b"], env)
    assert code == 3 and "its package is not on the DVC remote" in out, out
    origin = tags(bare)
    assert "en-de@v3.0.0" not in origin and "en-de#prod#3" not in origin
    assert origin["decision/en-de/0003"] == commits["c"]  # the refusal reached origin
    assert "en-de@v3.0.0" not in tags(clones["b"])
    store.unlink()
    (tmp_path / "store.away").rename(store)
    code, out = ran(["-m", "flows.registry", "publish"], clones["b"], env)
    assert code == 0 and "promoted as v3.0.0" in out, out
    origin = tags(bare)
    assert origin["en-de@v3.0.0"] == commits["c"] and "en-de#prod#3" in origin
    assert fetched(bare, tmp_path / "fresh3", "--stage", "prod") == "900"

    # origin unreachable: nothing decided, the run's state names origin
    b = clones["a"]  # (a, from here on)
    before = tags(b)
    sh("git", "remote", "set-url", "origin", str(tmp_path / "gone.git"), cwd=b)
    code, out = ran(["-m", "flows.promote", "a", "--line", "en-de"], b, env)
    assert code == 1 and "git remote 'origin'" in out and "cannot be reached" in out, out
    assert tags(b) == before
    with client() as c:
        runs = c.read_flow_runs(limit=50)
    failed = [r for r in runs if r.state and r.state.is_failed()]
    assert any("cannot be reached" in (r.state.message or "") for r in failed), [
        r.state.message for r in failed
    ]

    # a tag origin holds with another object: an error naming both commits, nothing decided
    sh("git", "remote", "set-url", "origin", str(bare), cwd=b)
    sh("git", "fetch", "-q", "origin", "refs/tags/*:refs/tags/*", cwd=b)
    sh("git", "tag", "-d", "en-de@v1.0.0", cwd=b)
    sh("git", "tag", "-a", "en-de@v1.0.0", commits["b"], "-m", "made apart", cwd=b)
    code, out = ran(["-m", "flows.promote", "a", "--line", "en-de"], b, env)
    assert code == 1, out
    assert f"is {commits['a'][:9]} on origin" in out and f"but {commits['b'][:9]} in" in out, out
    assert tags(bare) == origin
