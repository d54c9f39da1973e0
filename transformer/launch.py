"""torchrun, with the preemption notice and its exit code: the train stage's launcher.

    python -m transformer.launch --standalone --nproc_per_node=N --max-restarts=R \\
        -m transformer.train SHARDS TOKENIZER CKPT_DIR --resume

Its arguments are torchrun's, and torchrun's agent runs in this process. What it adds:
- SIGTERM or SIGUSR1 to it (or to any rank, which passes it on: preempt.py) is the preemption
  notice: every rank gets it, finishes its update, saves it, and this process exits
  preempt.PREEMPTED (75), where torchrun alone would exit 1, or restart the group;
- a group whose every failed rank exited 75 exits 75 too;
- SIGINT (Ctrl-C) exits 130 as a lone process does;
- a rank that exits graphs.REPLAY_FAILED (76: a captured update's replay failed, and the CUDA
  context may be unusable) is started afresh, in a new interpreter, when the training module's
  arguments hold --resume: it resumes from the newest checkpoint, running that batch shape (after
  a second failure, every shape) eagerly (graphs.py). At most MAX_REPLAY_RESTARTS times.
A rank that dies otherwise (killed, out of memory) restarts the group up to --max-restarts times;
each restart resumes from the newest checkpoint (the stage's --resume). torchrun waits
--shutdown-timeout seconds (30) for the ranks to save before it kills them.

One process on one node without restarts (`--nproc_per_node=1 --max-restarts=0`, the defaults)
has nothing for an agent to do: the module runs in this process, as `python -m` would run it
(no second interpreter, no rendezvous: ~4 s of CPU less per train stage), and the notice is the
rank's own (exit 75).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun

from transformer.training.graphs import REPLAY_FAILED
from transformer.training.preempt import LAUNCHER, PASS_ON, PREEMPTED, SIGNALS

# torchrun's own handling (stop the ranks, exit) for the rest; the notice's signals are ours
TORCHRUN_SIGNALS = "--signals-to-handle=SIGINT,SIGHUP,SIGQUIT"
_notified: list[int] = []
MAX_REPLAY_RESTARTS = 2  # a shape, then every shape: after that no replay is left to fail
RESTARTS = "TRANSFORMER_REPLAY_RESTARTS"  # how many this run has had (in the new process's env)


def _on_notice(signum: int, frame) -> None:
    """The first notice stops the agent as torchrun's own handler would, but passes SIGTERM on
    to the ranks: they save and exit. Later ones (a rank's echo, a second signal) are ignored."""
    _notified.append(signum)
    name = signal.Signals(signum).name
    if len(_notified) > 1:
        if signum != PASS_ON:  # (a rank's echo of the notice this process passed on: expected)
            os.write(2, f"{name}: already stopping; the ranks are saving\n".encode())
        return
    why = "a rank's preemption notice" if signum == PASS_ON else f"{name}: preemption notice"
    raise SignalException(f"{why}; stopping every rank after its update", signal.SIGTERM)


def alone(argv: list[str]) -> bool:
    """Whether torchrun's arguments ask for one process on one node, never restarted."""
    args = get_args_parser().parse_args(argv)
    nodes = "1" if args.standalone else str(args.nnodes)
    return nodes in ("1", "1:1") and args.nproc_per_node == "1" and args.max_restarts == 0


def run_alone(argv: list[str]) -> None:
    """The training module (or script) in this process, with its own arguments."""
    args = get_args_parser().parse_args(argv)
    sys.argv = [args.training_script, *args.training_script_args]
    if args.module:
        runpy.run_module(args.training_script, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(args.training_script, run_name="__main__")


def restart_after_replay_failure(argv: list[str]) -> None:
    """This launcher again, in a fresh interpreter (a fresh CUDA context), when the training
    module resumes (--resume) and restarts are left; else nothing (the caller exits 76)."""
    args = get_args_parser().parse_args(argv)
    done = int(os.environ.get(RESTARTS, "0"))
    if "--resume" not in args.training_script_args or done >= MAX_REPLAY_RESTARTS:
        print(f"not restarting after the failed replay (--resume not given, or {done} restarts)")
        return
    print(f"restarting after the failed replay ({done + 1} of at most {MAX_REPLAY_RESTARTS})")
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[RESTARTS] = str(done + 1)
    # sys.orig_argv: this interpreter's own command line (`python -m transformer.launch ...`)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def main(argv: list[str] | None = None) -> None:
    own = argv is None  # this interpreter's command line: one to start afresh
    argv = sys.argv[1:] if argv is None else argv
    if alone(argv):
        try:
            run_alone(argv)
        except SystemExit as e:
            if e.code == REPLAY_FAILED and own:
                restart_after_replay_failure(argv)
            raise
        return
    for s in (*SIGNALS, PASS_ON):
        signal.signal(s, _on_notice)
    os.environ[LAUNCHER] = str(os.getpid())  # the ranks inherit it
    # A restarted group's rank 0 hosts a new store: the agent's shared one keeps the lost
    # group's addresses, which a restarted rank may read before rank 0 replaces them (a gloo
    # connect to a dead rank, "Connection refused", on a busy machine)
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    try:
        torchrun([TORCHRUN_SIGNALS, *argv])
    except SignalException as e:
        if not _notified:  # torchrun's own signals: as a lone process dies of them
            sys.exit(130 if e.sigval == signal.SIGINT else 128 + e.sigval)
        print("preempted: every rank saved its last update; --resume goes on", file=sys.stderr)
        sys.exit(PREEMPTED)
    except ChildFailedError as e:
        if _notified or all(f.exitcode == PREEMPTED for f in e.failures.values()):
            sys.exit(PREEMPTED)
        if all(f.exitcode == REPLAY_FAILED for f in e.failures.values()):  # restarts spent
            sys.exit(REPLAY_FAILED)
        raise


if __name__ == "__main__":
    main()
