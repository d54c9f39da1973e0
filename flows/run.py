"""Start a deployment's flow run and follow it to its end: the command a script or cron job waits on.

    python -m flows.run DEPLOYMENT [-p KEY=VALUE ...] [--wait] [--timeout S]
    python -m flows.run pipeline/demo -p 'overrides=["train.max_steps=100"]' --wait
    python -m flows.run retrain/en-de --wait || mail -s "retrain failed" me < /dev/null

A value is read as JSON where it parses (a list, a number), else as a string. With --wait it
prints each state the run passes through and each stage (a task run, its subflows' included) as
it starts and ends (a train stage waiting for the machine's cores says so: flows/cores.py), then what the run decided (the experiment it saved and its BLEU, the
promotion gate's verdict and why, or why nothing was retrained; the run's warnings, such as a
champion that no DVC remote holds), then the final state and, for a failure, its message: the
stage and its own error line. A crash is not the end: the automation "retry crashed runs" reschedules the run and
the next serving process resumes it, so --wait follows it through its retries and reads a
Crashed state as final only once it has stayed so for --crash-grace seconds (the run gave up, or
nothing reschedules it). A lost connection to the server is retried, not fatal, for up to
--server-grace seconds (default 300) in a row; past that it gives up, naming the server's URL.

Exit status: 0 Completed, 1 Failed, 2 Crashed, 3 Cancelled, 4 not finished at --timeout, 5 the
run could not be started (no such deployment: the error lists those there are; a bad
parameter), 6 the Prefect server did not answer for --server-grace seconds (the run, if it was
started, goes on without this command).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

EXIT = {"COMPLETED": 0, "FAILED": 1, "CRASHED": 2, "CANCELLED": 3}
TIMEOUT, NOT_STARTED, UNREACHABLE = 4, 5, 6
SERVER_GRACE_S = 300.0  # a server restart takes seconds; minutes of silence is an outage


def parameter(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value parsed as JSON where it parses (as `prefect deployment run -p`)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def say(text: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {text}", flush=True)


def stage_name(task_run) -> str:
    """The stage a task run ran: its task's name (the flows name each task after its stage)."""
    return task_run.name.rsplit("-", 1)[0]


class Follower:
    """What has been printed of one flow run: its states, and its and its subflows' stages."""

    def __init__(self, run_id):
        self.run_id = run_id
        self.states: set = set()  # ids of the run's states printed
        self.tasks: dict = {}  # task run id -> state name printed
        self.failed: dict = {}  # task run id -> stage, for task runs whose last state failed

    def poll(self, client):
        """Print what is new; the flow run."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
        from prefect.client.schemas.filters import FlowRunFilterId as Id

        run = client.read_flow_run(self.run_id)
        for s in client.read_flow_run_states(self.run_id):
            if s.id not in self.states:
                self.states.add(s.id)
                say(f"run {run.name}: {s.name}" + (f": {s.message}" if s.message else ""))
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[self.run_id])
            )
        )
        ids = [self.run_id, *(f.id for f in subflows)]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=Id(any_=ids)))
        for t in sorted(tasks, key=lambda t: t.expected_start_time or t.created):
            name = t.state.name if t.state else "Pending"
            if self.tasks.get(t.id) != name:
                self.tasks[t.id] = name
                # a stage on its way says why where it says anything: a train stage waiting for
                # the machine's cores (AwaitingConcurrencySlot), a preempted one resuming
                why = t.state.message if t.state and not t.state.is_final() else None
                say(f"stage {stage_name(t)}: {name}" + (f": {why}" if why else ""))
                self.failed.pop(t.id, None)
                if t.state and t.state.is_failed():
                    self.failed[t.id] = stage_name(t)
        return run


def outcome(client, run) -> list[str]:
    """What the run decided, as its flows published it in Prefect: its warnings (the run's log,
    e.g. a champion no remote holds) and its artifacts' descriptions (the experiment and its
    BLEU, the promotion decision and why, or why nothing was retrained), oldest first."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
        LogFilterLevel,
    )

    logs = client.read_logs(
        # warnings only: a failure's errors are its state message, printed last
        LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[run.id]), level=LogFilterLevel(ge_=30, le_=39)
        ),
        limit=50,
    )
    arts = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
    )
    warned = dict.fromkeys(f"warning: {log.message.splitlines()[0]}" for log in logs)
    told = [a.description for a in sorted(arts, key=lambda a: a.created) if a.description]
    return [*warned, *told]


def settled_outcome(client, run, rounds: int = 3) -> list[str]:
    """outcome() once the run's last logs have reached the server: the run's process sends its
    logs in batches (every `logging.to_api.batch_interval` s), so a warning logged just before
    the end may land after the final state. Read again a batch later until nothing new comes."""
    from prefect.settings import get_current_settings

    wait_s = get_current_settings().logging.to_api.batch_interval + 0.5
    lines = outcome(client, run)
    for _ in range(rounds):
        time.sleep(wait_s)
        again = outcome(client, run)
        if again == lines:
            break
        lines = again
    return lines


class Unreachable(Exception):
    """The Prefect server did not answer for server_grace_s seconds in a row."""


@contextlib.contextmanager
def own_retries() -> Iterator[None]:
    """Prefect's client calls without their own retries (up to a minute of backoff per call
    once connected): this command's loops retry, so that --server-grace bounds the wait."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}):
        yield


def server_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or "(PREFECT_API_URL not set)"


def silent(since: float | None, grace_s: float, e: Exception) -> float:
    """When the server's silence began (`since`, or now); Unreachable once it lasted grace_s."""
    since = since or time.monotonic()
    if time.monotonic() - since >= grace_s:
        raise Unreachable(
            f"the Prefect server at {server_url()} did not answer for {grace_s:g} s "
            f"({type(e).__name__}: {e})"
        ) from e
    say(f"the Prefect server did not answer ({e}); trying again")
    return since


def follow(
    run_id,
    crash_grace_s: float,
    timeout_s: float | None,
    every_s: float = 2.0,
    server_grace_s: float = SERVER_GRACE_S,
) -> int:
    """Print the run's progress until it ends; its exit status (EXIT, TIMEOUT, or UNREACHABLE
    once the server has not answered for `server_grace_s`)."""
    import httpx
    from prefect.client.orchestration import get_client

    follower = Follower(run_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    crashed_since, silent_since, state = None, None, "unknown (the server did not answer)"
    # one client for the whole wait: a new one costs ~50 ms of CPU and asks the server for its
    # version, which polling would pay every round; after an error httpx connects again
    with own_retries(), contextlib.ExitStack() as open_client:
        client = None
        while deadline is None or time.monotonic() < deadline:
            try:
                client = client or open_client.enter_context(get_client(sync_client=True))
                run = follower.poll(client)
            except (httpx.HTTPError, OSError) as e:  # the server restarting: not the run's end
                try:
                    silent_since = silent(silent_since, server_grace_s, e)
                except Unreachable as gone:
                    say(f"error: {gone}; stopped following run {run_id}, last seen {state}")
                    return UNREACHABLE
                time.sleep(every_s * 5)
                continue
            silent_since = None
            kind, state = run.state.type.value, run.state.name
            if kind == "CRASHED":
                crashed_since = crashed_since or time.monotonic()
                if time.monotonic() - crashed_since < crash_grace_s:
                    kind = None  # the retry automation may reschedule it yet
            else:
                crashed_since = None
            if kind in EXIT:
                return ended(client, run, follower)
            time.sleep(every_s)
    say(f"run {run_id} not finished after {timeout_s:.0f} s; still {state}")
    return TIMEOUT


def ended(client, run, follower: Follower) -> int:
    """Print what the ended run decided and its verdict; its exit status."""
    import httpx

    verdict = f"run {run.name} ended {run.state.name} after {run.run_count} attempt(s)"
    with contextlib.suppress(httpx.HTTPError, OSError):
        for line in settled_outcome(client, run):
            say(line)
    kind = run.state.type.value
    if kind != "COMPLETED":
        failed = list(follower.failed.values())
        stage = f" in stage {failed[-1]}" if failed else ""
        # the cause; the stage output's tail: `prefect flow-run inspect ID`
        verdict += f"{stage}: {(run.state.message or 'no message').splitlines()[0]}"
    say(verdict)
    return EXIT[kind]


class NoDeployment(Exception):
    """No deployment of that name: the message lists those the server has."""

    def __init__(self, name: str, known: list[str]):
        there = ", ".join(known) or "none (is `python -m flows.serve` running?)"
        super().__init__(f"no deployment {name!r} on {server_url()}; deployments: {there}")


def start(deployment: str, parameters: dict[str, Any], server_grace_s: float = SERVER_GRACE_S):
    """A new flow run of `deployment` (as `prefect deployment run` makes it). A refused
    connection is tried again for up to `server_grace_s` (no request reached the server, so
    no run is made twice); then Unreachable. NoDeployment where the server has no such one."""
    import httpx
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    silent_since = None
    while True:
        try:
            return run_deployment(deployment, parameters=parameters, timeout=0)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            silent_since = silent(silent_since, server_grace_s, e)
            time.sleep(min(10.0, server_grace_s / 5))
        except (ObjectNotFound, ValueError) as e:  # ValueError: no "/" in the name
            if isinstance(e, ObjectNotFound) or "/" not in deployment:
                raise NoDeployment(deployment, deployments()) from e
            raise


def deployments() -> list[str]:
    """FLOW/DEPLOYMENT of each deployment on the server, sorted."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flow_names = {f.id: f.name for f in client.read_flows()}
        return sorted(
            f"{flow_names.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments()
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("deployment", help="FLOW/DEPLOYMENT, e.g. pipeline/demo")
    parser.add_argument(
        "-p", "--param", type=parameter, action="append", default=[], metavar="KEY=VALUE"
    )
    parser.add_argument("--wait", action="store_true", help="follow the run to its end")
    parser.add_argument(
        "--crash-grace",
        type=float,
        default=180.0,
        metavar="S",
        help="seconds a Crashed run may wait for its retry (default 180)",
    )
    parser.add_argument("--timeout", type=float, metavar="S", help="give up waiting after S s")
    parser.add_argument(
        "--server-grace",
        type=float,
        default=SERVER_GRACE_S,
        metavar="S",
        help=f"seconds the Prefect server may stay unreachable before this gives up, exit "
        f"{UNREACHABLE} (default {SERVER_GRACE_S:g})",
    )
    args = parser.parse_args(argv)
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    try:
        run = start(args.deployment, dict(args.param), args.server_grace)
    except NoDeployment as e:
        say(f"error: {e}")
        sys.exit(NOT_STARTED)
    except (PrefectHTTPStatusError, ValueError) as e:  # a parameter its flow does not take
        say(f"error: could not start a run of {args.deployment}: {e}")
        sys.exit(NOT_STARTED)
    except Unreachable as e:
        say(f"error: {e}: no run started")
        sys.exit(UNREACHABLE)
    except httpx.HTTPError as e:  # the connection failed mid-request: the run may exist
        say(
            f"error: the Prefect server at {server_url()} failed mid-request ({e}): a run may "
            "have started (`prefect flow-run ls` lists them)"
        )
        sys.exit(UNREACHABLE)
    say(f"started flow run {run.name} of {args.deployment}: UUID: {run.id}")
    if args.wait:
        sys.exit(follow(run.id, args.crash_grace, args.timeout, server_grace_s=args.server_grace))


if __name__ == "__main__":
    main()
