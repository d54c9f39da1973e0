"""Serve the deployments from the project root: `python -m flows.serve` (Ctrl-C stops it).

  pipeline/demo              the offline demo preset
  pipeline/wmt14-en-de-base  the paper's base model on WMT 2014 en-de
  retrain/retrain            weekly (cron below), at most one run at a time

This process creates the deployments on the Prefect server named by PREFECT_API_URL and runs
their flow runs as subprocesses in this directory. Parameters a run may pass: `preset`,
`overrides` (a list of `dvc exp run -S` strings, e.g. '["train.max_steps=10"]'), `project`.
"""

from __future__ import annotations

import argparse
import os

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType

from flows.pipeline import pipeline
from flows.retrain import retrain

RETRAIN_CRON = "0 3 * * 1"  # Mondays 03:00


def deployments(cron: str = RETRAIN_CRON) -> list:
    by_module = {"entrypoint_type": EntrypointType.MODULE_PATH}  # flows.pipeline.pipeline
    return [
        pipeline.to_deployment("demo", parameters={"preset": "demo"}, **by_module),
        pipeline.to_deployment(
            "wmt14-en-de-base", parameters={"preset": "wmt14-en-de-base"}, **by_module
        ),
        retrain.to_deployment(
            "retrain",
            cron=cron,
            **by_module,
            concurrency_limit=ConcurrencyLimitConfig(
                limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
            ),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cron",
        default=os.environ.get("RETRAIN_CRON", RETRAIN_CRON),
        help=f"the retrain schedule (default {RETRAIN_CRON!r})",
    )
    args = parser.parse_args(argv)
    serve(*deployments(args.cron))


if __name__ == "__main__":
    main()
