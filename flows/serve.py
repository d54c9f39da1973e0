"""Serve the deployments from the project root: `python -m flows.serve` (Ctrl-C stops it).

  pipeline/demo              the offline demo preset
  pipeline/wmt14-en-de-base  the paper's base model on WMT 2014 en-de
  retrain/NAME               each line's retrain (dvc.yaml's artifacts, flows/lines.py): its
                             recipe, on its schedule, at most one run at a time per line and
                             the lines at once, their train stages in turns (flows/cores.py)
  retrain/retrain            instead, for a project whose one artifact declares no line (no
                             meta): the recipe of --retrain-preset and --retrain-override, on
                             --cron, as before lines
  promote/promote            put an experiment through the promotion gate (-p experiment=NAME)

This process creates the deployments, the crash-recovery automations (flows/automations.py) and
this machine's train limit (--train-slots train stages at once, default 1: flows/cores.py)
on the Prefect server named by PREFECT_API_URL, and runs their flow runs as subprocesses, each
sending a heartbeat every 30 s. Run it under a supervisor that restarts it (systemd's
Restart=always): a crashed run is rescheduled and the restarted process resumes it. Parameters
a run may pass: `preset`, `overrides` (a list of `dvc exp run -S` strings, e.g.
'["train.max_steps=10"]'; on `retrain/NAME` they come after the line's own, its gate kept),
`rev` (the commit to train; default HEAD), `project`. A line's recipe, schedule and gate are
its dvc.yaml meta (flows/lines.py): --retrain-preset and --retrain-override on a project that
declares lines are an error.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType

from flows import automations, cores, lines, registry
from flows.pipeline import pipeline
from flows.promote import promote
from flows.retrain import retrain
from transformer.core.presets import DEMO

RETRAIN_CRON = "0 3 * * 1"  # Mondays 03:00


def project_tag(path: Path) -> str:
    """The Prefect tag of the flow runs of the project checked out at `path` (flows.results
    finds its failed runs by it)."""
    return f"project:{Path(path).resolve()}"


def specs(
    cron: str = RETRAIN_CRON,
    preset: str = DEMO,
    overrides: list[str] | None = None,
    project: Path = Path("."),
    local_only: bool = False,
) -> list[tuple[Any, str, dict[str, Any]]]:
    """(flow, deployment name, deployment options) of each deployment; deploy.py's too. The
    project's lines are read (and checked: lines.LineError) here, before anything runs.
    `local_only`: the retrain and promote runs decide without the git remote origin."""
    out = [
        (pipeline, DEMO, {"parameters": {"preset": DEMO}}),
        (pipeline, "wmt14-en-de-base", {"parameters": {"preset": "wmt14-en-de-base"}}),
        *retrain_specs(lines.read(Path(project)), cron, preset, overrides),
        (promote, "promote", {}),
    ]
    for f, _, options in out if local_only else ():
        if f is not pipeline:
            options.setdefault("parameters", {})["local_only"] = True
    return out


def retrain_specs(
    found: list[lines.Line], cron: str, preset: str, overrides: list[str] | None
) -> list[tuple[Any, str, dict[str, Any]]]:
    """A `retrain/NAME` per line; `retrain/retrain` with the flags' recipe and cron for a
    project whose one artifact declares no line, as before lines."""
    from prefect.schedules import Cron

    # per deployment: one run at a time per line, the lines at once; the next one waits
    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
    )
    if len(found) == 1 and not found[0].declared:
        params = {"preset": preset, "overrides": list(overrides or [])}
        return [
            (
                retrain,
                "retrain",
                {"cron": cron, "concurrency_limit": one_at_a_time, "parameters": params},
            )
        ]
    out = []
    for x in found:
        # the line alone: each run reads the line's recipe and gate from the commit it trains,
        # and a run's `-p overrides` come after the line's own (flows/recipe.py)
        params: dict[str, Any] = {"line": x.name}
        if not x.declared:  # one of several artifacts without meta: the flags' recipe
            params.update(preset=preset, overrides=list(overrides or []))
        schedule = {"cron": cron} if not x.declared else {}
        if x.cron:
            schedule = {"schedule": Cron(x.cron, timezone=x.timezone or "UTC")}
        options = {"concurrency_limit": one_at_a_time, "parameters": params, **schedule}
        out.append((retrain, x.name, options))
    return out


def deployments(
    cron: str = RETRAIN_CRON,
    preset: str = DEMO,
    overrides: list[str] | None = None,
    local_only: bool = False,
) -> list:
    """The deployments this process serves, its flows imported by module path."""
    tags = [project_tag(Path.cwd())]  # the flows run in this checkout (project ".")
    return [
        f.to_deployment(name, entrypoint_type=EntrypointType.MODULE_PATH, tags=tags, **options)
        for f, name, options in specs(cron, preset, overrides, local_only=local_only)
    ]


def add_recipe_args(parser: argparse.ArgumentParser) -> None:
    """The retrain deployment's schedule and recipe (serve's and deploy's flags)."""
    parser.add_argument(
        "--cron",
        help=f"the retrain schedule of a project without lines (default $RETRAIN_CRON, else "
        f"{RETRAIN_CRON!r}); a line's is its dvc.yaml meta.cron",
    )
    parser.add_argument(
        "--retrain-preset",
        help="the preset the scheduled retrain of a project without lines trains (default: "
        f"{DEMO}); a line's recipe is its dvc.yaml meta.recipe",
    )
    parser.add_argument(
        "--local-only",
        action="store_true",
        help="serve retrain and promote without a default DVC remote and without deciding "
        "against the git remote origin: the champion stays in this machine's tags and DVC "
        "cache until `python -m flows.registry publish`",
    )
    parser.add_argument(
        "--retrain-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of the retrain recipe of a project without lines (repeatable), e.g. "
        "train.max_steps=2000",
    )
    parser.add_argument(
        "--train-slots",
        type=int,
        metavar="N",
        help="train stages at once on a machine, the lines' and the pipeline's (a Prefect "
        f"global concurrency limit per machine; default: {cores.SLOTS_ENV} or 1; 0: no limit)",
    )


def recipe_args(
    argv: list[str] | None, prog: str, doc: str, project: Path = Path(".")
) -> argparse.Namespace:
    """The command line of `prog` (serve or deploy): its flags, the recipe's overrides checked
    against params.yaml's schema (a typo fails here, not at 03:00 on Monday), and a default DVC
    remote required unless --local-only (a champion no other clone can fetch is a surprise)."""
    from flows.shell import check_override
    from transformer.core.settings import ConfigError

    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if prog.endswith("deploy"):
        parser.add_argument("--pool", required=True, help="a work pool of type process")
    add_recipe_args(parser)
    args = parser.parse_args(argv)
    try:  # a bad declaration stops serve/deploy before anything runs
        found = lines.read(project) if (project / "dvc.yaml").exists() else []
    except lines.LineError as e:
        parser.exit(2, f"{prog}: error: {e}\n")
    if (args.retrain_preset or args.retrain_override) and found and all(x.declared for x in found):
        parser.exit(
            2,
            f"{prog}: error: --retrain-preset and --retrain-override set the recipe of a project "
            f"whose artifact declares no line; {project.resolve() / 'dvc.yaml'} declares the "
            f"lines {', '.join(x.name for x in found)}: put the recipe in the line's "
            "meta.recipe (preset, overrides) and commit it, or give one run its own with "
            "`python -m flows.run retrain/NAME -p overrides='[...]'`\n",
        )
    if args.cron and found and all(x.declared for x in found):  # it would be ignored there
        parser.exit(
            2,
            f"{prog}: error: --cron sets the schedule of a project whose artifact declares no "
            f"line; {project.resolve() / 'dvc.yaml'} declares the lines "
            f"{', '.join(x.name for x in found)}: put each line's schedule in its meta.cron "
            "(and meta.timezone) and commit it\n",
        )
    args.cron = args.cron or os.environ.get("RETRAIN_CRON", RETRAIN_CRON)
    args.retrain_preset = args.retrain_preset or DEMO
    for override in args.retrain_override:
        try:
            check_override(override)
        except ConfigError as e:
            parser.error(str(e))
    try:
        cores.slots(args.train_slots), cores.limit_name()
    except cores.SlotError as e:
        parser.error(str(e))
    if not args.local_only and registry.default_remote(project) is None:
        parser.error(
            f"{project.resolve()} has no default DVC remote, so promotions would stay on this "
            "machine. Add one and commit it (`dvc remote add -d store URL && git commit "
            ".dvc/config -m 'DVC remote'`), or pass --local-only"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = recipe_args(argv, "python -m flows.serve", __doc__)
    automations.install(automations.HEARTBEAT_S)
    if turns := cores.install(args.train_slots):  # the served runs' train stages take turns
        print(turns, flush=True)
    if args.local_only and registry.default_remote(Path(".")) is None:
        print(
            "--local-only: no default DVC remote, so a promoted champion stays in this "
            "machine's DVC cache and no other clone can fetch it, until you add a remote "
            "(`dvc remote add -d store URL`, committed) and run `python -m flows.registry "
            "publish`",
            flush=True,
        )
    declared = {x.name: x for x in lines.read(Path(".")) if x.declared}
    found = specs(args.cron, args.retrain_preset, args.retrain_override, local_only=args.local_only)
    for f, name, options in found:
        if f is retrain:
            when = options.get("cron") or getattr(options.get("schedule"), "cron", None)
            shown = dict(options["parameters"])
            if x := declared.get(name):  # the recipe as the checkout declares it now
                shown["recipe"] = {"preset": x.preset, "overrides": list(x.overrides)}
            print(f"retrain/{name}: " + json.dumps({**shown, "schedule": when}))
    serve(
        *deployments(args.cron, args.retrain_preset, args.retrain_override, args.local_only),
        heartbeat_seconds=automations.HEARTBEAT_S,
    )


if __name__ == "__main__":
    main()
