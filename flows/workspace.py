"""The run workspace: where every flow run of a project works, never in the user's checkout.

A git worktree of the project at `.dvc/tmp/flows/workspace` (DVC's own scratch folder, which git
ignores; a line's retrain at `.dvc/tmp/flows/lines/NAME`, one per line, each behind its own lock), checked out at the commit a run asks for, with the run's params.yaml written into it
and the project's DVC cache shared (so nothing is stored twice and unchanged stages are skipped).
It persists between runs: DVC's dvc.lock and the outputs there say what is up to date, and a
crashed run's retry finds its checkpoints and resumes. Experiments saved there are refs of the
project's own git repository, so `dvc exp show` in the checkout lists them.

Why not `dvc exp run --temp` / `--queue`: each makes a new temporary copy per run, so a retry
after a crash would start training afresh; and DVC's temp runs have known lock problems when
they overlap (treeverse/dvc#5718, #8628, #10673). Runs of one workspace are serialised anyway
(`locks.workspace_lock`), so one workspace per line suffices; two lines' runs share only the DVC
cache (content-addressed, written atomically) and the git repository's refs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from flows.shell import logger

WORKSPACE = Path(".dvc/tmp/flows/workspace")  # inside the project; DVC's .gitignore covers tmp/
LINES = Path(".dvc/tmp/flows/lines")  # a line's workspace: LINES / NAME


def path(project: Path, line: str | None = None) -> Path:
    """The run workspace of line `line` (None: the pipeline flow's)."""
    return Path(project) / (WORKSPACE if line is None else LINES / file_name(line))


def file_name(line: str) -> str:
    """Line `line`'s name as one file name: "/" escaped, so that line a's folder does not hold
    line a/b's (reap() kills what runs inside a workspace), nor its lock file line a/b's."""
    return line.replace("/", "%2F")


class WorkspaceError(RuntimeError):
    """The project cannot host a run (not a git repository, an unknown revision, ...)."""


def git(*args: str, cwd: Path) -> str:
    """`git ARGS` in `cwd`; its stdout, or WorkspaceError with git's own message."""
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise WorkspaceError(f"git {' '.join(args)} (in {cwd}): {r.stderr.strip() or r.stdout}")
    return r.stdout.strip()


def resolve(project: Path, rev: str) -> str:
    """The full commit id of `rev` in the project's repository."""
    try:
        return git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}", cwd=project)
    except WorkspaceError as e:
        raise WorkspaceError(
            f"{project}: no commit {rev!r}: a run trains committed code (the project must be a "
            f"git repository with at least one commit) ({e})"
        ) from None


def prepare(project: Path, rev: str, line: str | None = None) -> tuple[Path, str]:
    """The workspace (line `line`'s) checked out at `rev` (its tracked files as committed),
    sharing the project's DVC cache; (its path, the commit). Untracked state (dvc.lock, data/)
    carries over."""
    project = project.resolve()
    commit = resolve(project, rev)
    ws = path(project, line)
    reap(ws)  # a crashed attempt's stage processes must not write into this run
    release_dead_locks(ws)
    registered = ws.resolve() in {
        Path(line.split(" ", 1)[1]).resolve()
        for line in git("worktree", "list", "--porcelain", cwd=project).splitlines()
        if line.startswith("worktree ")
    }
    if not (registered and (ws / ".git").exists()):
        git("worktree", "prune", cwd=project)
        ws.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--force", "--detach", str(ws), commit, cwd=project)
        logger().info("created the run workspace %s", ws)
    else:
        git("checkout", "--force", "--detach", commit, cwd=ws)
    set_aside_unreadable_lock(ws)
    share_cache(project, ws)
    return ws, commit


def share_cache(project: Path, ws: Path) -> None:
    """The workspace's DVC config: the project's local config (remote credentials), and the
    project's cache directory, wherever the project configures it (what `dvc cache dir --local`
    writes, without a process per run)."""
    from dvc.config import Config
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        cache_dir = repo.cache.local_cache_dir
    local = project / ".dvc" / "config.local"
    text = local.read_text() if local.exists() else ""
    (ws / ".dvc" / "config.local").write_text(text)
    with Config(dvc_dir=str(ws / ".dvc")).edit("local") as conf:
        conf["cache"]["dir"] = cache_dir


def reap(ws: Path) -> list[int]:
    """Kill what a crashed run left running in the workspace: every process whose working
    directory is inside it (DVC's stage commands run there: torchrun and its workers too).
    Linux (/proc); elsewhere nothing is found. The pids killed."""
    root = str(ws.resolve())
    found = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        pid = int(pid_dir.name)
        if pid == os.getpid():
            continue
        try:
            cwd = os.readlink(pid_dir / "cwd")
        except OSError:  # gone, or not ours to read
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            found.append(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in found if _signal(p, sig)]
        if not alive:
            break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in alive):
            time.sleep(0.1)
    if found:
        logger().warning(
            "killed %d process(es) a crashed run left in %s: %s", len(found), ws, found
        )
    return found


def set_aside_unreadable_lock(ws: Path) -> Path | None:
    """Move a dvc.lock that DVC cannot read to dvc.lock.unreadable (where it went, or None).
    DVC rewrites the file in place, so a stage killed while it wrote (a kill -9, a dying
    machine) leaves it empty or cut, and every later run would fail on it. Without it DVC checks
    each stage again: its run cache restores outputs it has made before, training resumes from
    its checkpoints."""
    from dvc.exceptions import DvcException
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA
    from dvc.utils.serialize import parse_yaml
    from voluptuous import Invalid

    lock = ws / "dvc.lock"
    try:
        COMPILED_LOCKFILE_SCHEMA(parse_yaml(lock.read_text(), str(lock)))
    except FileNotFoundError:
        pass
    except (DvcException, Invalid, UnicodeDecodeError) as e:  # YAML, schema, encoding
        aside = lock.with_name("dvc.lock.unreadable")
        lock.replace(aside)
        logger().warning(
            "%s cannot be read (%s), as a run killed while DVC wrote it leaves it: moved to %s; "
            "DVC checks every stage again",
            lock,
            str(e).splitlines()[0] if str(e) else type(e).__name__,
            aside,
        )
        return aside
    return None


def release_dead_locks(ws: Path) -> list[int]:
    """Drop the entries of DVC's rwlock in the workspace whose process is gone (killed with its
    run). DVC drops them itself, but only when a later command waits on the same path, and it
    counts a zombie as alive. Runs are serialised and reap() has run: nothing else holds one."""
    path = ws / ".dvc" / "tmp" / "rwlock"
    try:
        lock = json.loads(path.read_text())
    except OSError:
        return []
    except ValueError:  # cut short by a kill while DVC wrote it; nothing holds a lock now
        path.unlink()
        logger().warning("removed DVC's unreadable lock file %s", path)
        return []
    dead = set()
    for mode in ("read", "write"):
        for held, infos in list((lock.get(mode) or {}).items()):
            alive = [
                i
                for i in (infos if isinstance(infos, list) else [infos])
                if _running(i["pid"]) or dead.add(i["pid"])
            ]
            if alive:
                lock[mode][held] = alive if isinstance(infos, list) else alive[0]
            else:
                del lock[mode][held]
    if dead:
        path.write_text(json.dumps(lock))
        logger().warning(
            "released DVC's locks of %d process(es) a crashed run left: %s", len(dead), sorted(dead)
        )
    return sorted(dead)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie's pid stays until its parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
