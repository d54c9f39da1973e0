"""torchrun, with the preemption notice and its exit code: the train stage's launcher.

    python -m transformer.launch --standalone --nproc_per_node=N --max-restarts=R \\
        -m transformer.train SHARDS TOKENIZER CKPT_DIR --resume

Its arguments are torchrun's, and torchrun's agent runs in this process. What it adds:
- SIGTERM or SIGUSR1 to it (or to any rank, which passes it on: preempt.py) is the preemption
  notice: every rank gets it, finishes its update, saves it, and this process exits
  preempt.PREEMPTED (75), where torchrun alone would exit 1, or restart the group;
- a group whose every failed rank exited 75 exits 75 too;
- SIGINT (Ctrl-C) exits 130 as a lone process does.
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

from transformer.training.preempt import LAUNCHER, PASS_ON, PREEMPTED, SIGNALS

# torchrun's own handling (stop the ranks, exit) for the rest; the notice's signals are ours
TORCHRUN_SIGNALS = "--signals-to-handle=SIGINT,SIGHUP,SIGQUIT"
_notified: list[int] = []


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if alone(argv):
        run_alone(argv)
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
        raise


if __name__ == "__main__":
    main()
