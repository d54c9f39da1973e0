"""Register the deployments on a `process` work pool, for a Prefect worker on the GPU machine
(under systemd, say) instead of `python -m flows.serve`:

    prefect work-pool create gpu --type process        # once, on the server
    python -m flows.deploy --pool gpu                  # the deployments, run from this checkout
    prefect worker start --pool gpu                    # on the machine, a service (README)

The deployments are serve.py's (the same names, parameters, schedules and concurrency limits:
a `retrain/NAME` per line of dvc.yaml, one run at a time per line, the lines at once, their
train stages in turns on each machine: flows/cores.py), loaded from this checkout's folder, run
with it as their working directory and with 30-second heartbeats; the crash-recovery automations
are installed too. Each worker's machine creates its own train limit at its first train stage,
sized by --train-slots (else the worker's FLOWS_TRAIN_SLOTS, else 1).
"""

from __future__ import annotations

from pathlib import Path

from flows import automations, cores
from flows.serve import RETRAIN_CRON, project_tag, recipe_args, specs
from transformer.core.presets import DEMO

ROOT = Path(__file__).resolve().parent.parent


def deploy(
    pool: str,
    project: Path = ROOT,
    cron: str = RETRAIN_CRON,
    preset: str = DEMO,
    overrides: list[str] | None = None,
    local_only: bool = False,
    train_slots: int | None = None,
) -> list[str]:
    """Create or update every deployment on work pool `pool`; their names. `train_slots`: the
    train stages at once on each worker's machine (its limit, created at its first train stage:
    flows/cores.py), where not the worker's FLOWS_TRAIN_SLOTS or 1."""
    from prefect import Flow

    env = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(automations.HEARTBEAT_S)}
    if train_slots is not None:
        env[cores.SLOTS_ENV] = str(train_slots)
    names = []
    for f, name, options in specs(cron, preset, overrides, project, local_only):
        entry = f"{f.fn.__module__.replace('.', '/')}.py:{f.fn.__name__}"
        Flow.from_source(source=str(project), entrypoint=entry).deploy(
            name,
            work_pool_name=pool,
            build=False,
            push=False,
            print_next_steps=False,
            ignore_warnings=True,  # Prefect's hint to use serve() on a process pool: meant
            job_variables={"working_dir": str(project), "env": env},
            tags=[project_tag(project)],
            **options,
        )
        names.append(f"{f.name}/{name}")
    automations.install()
    return names


def main(argv: list[str] | None = None) -> None:
    args = recipe_args(argv, "python -m flows.deploy", __doc__, ROOT)
    found = deploy(
        args.pool,
        ROOT,
        args.cron,
        args.retrain_preset,
        args.retrain_override,
        args.local_only,
        args.train_slots,
    )
    for name in found:
        print(f"deployment {name} on work pool {args.pool}")


if __name__ == "__main__":
    main()
