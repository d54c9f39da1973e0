"""Crash recovery on the Prefect server: two automations, created or updated idempotently.

1. Zombies. A flow run reports a heartbeat every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds
   (serve.py sets 30). When a run's heartbeats stop for MISSED heartbeats while it has not
   finished (its process, or the machine, died without a word), the server marks it Crashed,
   saying so. This is the recipe of Prefect's docs ("Detect zombie flows"); it needs the
   server's automations service, which `prefect server start` runs.
2. Retries. A crashed run of this project's flows is rescheduled (AwaitingRetry, the state the
   UI's Retry button sets). The next process serving its deployment picks it up; the flow
   resumes in its run workspace (DVC skips finished stages, training continues from its newest
   checkpoint). The bound is the automation's own: it matches a crash only on attempts 1 to
   pipeline.MAX_ATTEMPTS - 1 (the event's run count), so the crash of the last attempt stays
   Crashed, whichever flow it was; each flow's start_attempt() also gives up past the bound.

    python -m flows.automations        # what serve.py does at start; a worker setup runs this once
"""

from __future__ import annotations

from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from flows.pipeline import MAX_ATTEMPTS

HEARTBEAT_S = 30  # Prefect's minimum; each flow run process sends one this often
MISSED = 3  # heartbeats missed before a run counts as dead
FLOWS = ("pipeline", "retrain", "promote")  # each calls pipeline.start_attempt() first
# the attempts whose crash is rescheduled: all but the last (a run that crashed before it ever
# ran, run count 0, is not: its next try would not run either)
RESCHEDULED = [str(n) for n in range(1, MAX_ATTEMPTS)]
TERMINAL = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}


def zombies(heartbeat_s: int = HEARTBEAT_S) -> Automation:
    window = heartbeat_s * MISSED
    return Automation(
        name="transformer-pipeline: crash zombie flow runs",
        description="A flow run whose heartbeats stopped is marked Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *TERMINAL},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=window),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {window} s: the process running this flow run (a "
                "`flows.serve` process or a worker's), or its machine, died",
            )
        ],
    )


def retries() -> Automation:
    return Automation(
        name="transformer-pipeline: retry crashed runs",
        description=(
            "A crashed run of the pipeline, retrain or promote flows is rescheduled, "
            f"up to its attempt {MAX_ATTEMPTS}."
        ),
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification(
                {"prefect.resource.id": ["prefect.flow-run.*"], "prefect.run-count": RESCHEDULED}
            ),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "flow", "prefect.resource.name": list(FLOWS)}
            ),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                name="AwaitingRetry",
                message="rescheduled after a crash: it resumes in its run workspace",
            )
        ],
    )


def install(heartbeat_s: int = HEARTBEAT_S) -> list[Automation]:
    """Create both automations, or update them in place (matched by name)."""
    out = []
    for wanted in (zombies(heartbeat_s), retries()):
        try:
            found = Automation.read(name=wanted.name)
        except ValueError:
            out.append(wanted.create())
            continue
        wanted.id = found.id
        wanted.update()
        out.append(wanted)
    return out


def main() -> None:
    for a in install():
        print(f"automation {a.name!r}: {a.id}")


if __name__ == "__main__":
    main()
