"""@flow retrain: refresh the data; if its content hash moved since the champion, rerun the
pipeline and promote the candidate only if its BLEU beats the champion's by `retrain.margin`.

The champion pointer (params.yaml `retrain.champion`, default models/champion.json) is one JSON
file, replaced atomically: the experiment, its commit, BLEU, signature and input hashes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.dag import read_dag
from flows.lineage import DOWNLOAD, data_hash
from flows.pipeline import pipeline, run_stages
from flows.shell import apply_params, logger, workspace_lock
from transformer.config import RetrainConfig, load
from transformer.files import atomic_write


def gate(
    candidate: dict[str, Any], champion: dict[str, Any] | None, margin: float
) -> tuple[bool, str]:
    """(promote?, why): only a comparable candidate with BLEU above champion + margin wins."""
    if candidate.get("bleu") is None:
        return False, "the candidate has no BLEU score; not promoted"
    if champion is None or champion.get("bleu") is None:
        return True, "no champion yet" if champion is None else "the champion has no BLEU score"
    # champions recorded before `split` was: they were scored on evaluate.split's default
    candidate, champion = ({"split": "test", **r} for r in (candidate, champion))
    for key in ("split", "test_sha256", "bleu_signature"):
        if candidate.get(key) is None or candidate.get(key) != champion.get(key):
            return False, (
                f"not comparable: {key} differs (champion {champion.get(key)!r}, "
                f"candidate {candidate.get(key)!r}); champion kept"
            )
    new, old = float(candidate["bleu"]), float(champion["bleu"])
    if new - old > margin:
        return True, f"candidate BLEU {new:.2f} beats champion {old:.2f} by more than {margin}"
    return False, (
        f"candidate BLEU {new:.2f} does not beat champion {old:.2f} by more than "
        f"the margin {margin}; champion kept"
    )


def read_champion(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def write_champion(path: Path, record: dict[str, Any]) -> None:
    """Replace the champion pointer in one rename: readers see the old or the new, never half."""
    with atomic_write(path, "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


@flow(name="retrain", log_prints=True)
def retrain(
    preset: str | None = None,
    overrides: list[str] | None = None,
    project: str = ".",
    refresh_data: bool = True,
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
) -> dict[str, Any]:
    """Retrain only on new data; promote only a better candidate. Returns the decision and why."""
    root = Path(project).resolve()
    with workspace_lock(root):
        apply_params(root, preset, list(overrides or []))
        cfg = load(RetrainConfig, "retrain", root / "params.yaml")
        champion_path = root / cfg.champion
        champion = read_champion(champion_path)
        dag = read_dag(root)
        force = (
            (DOWNLOAD,) if refresh_data else ()
        )  # fetch the source again, even if DVC says fresh
        run_stages(root, {DOWNLOAD: dag[DOWNLOAD]}, download_retries, retry_delay_s, force)
        data = data_hash(root, dag)
        if champion and champion.get("data_hash") == data:
            out = {
                "retrained": False,
                "promoted": False,
                "reason": f"training data unchanged since the champion ({data}); nothing retrained",
            }
        else:
            # the preset and overrides again (applied above already: the same params.yaml), so
            # that the candidate's lineage, and a promoted champion's, records them
            candidate = pipeline(
                preset=preset,
                overrides=list(overrides or []),
                project=str(root),
                download_retries=download_retries,
                retry_delay_s=retry_delay_s,
            )
            promote, reason = gate(candidate, champion, cfg.margin)
            if promote:
                write_champion(
                    champion_path,
                    {
                        **{k: v for k, v in candidate.items() if k != "stages"},
                        "promoted_at": datetime.now(UTC).isoformat(),
                        "promoted_by": f"retrain flow run {flow_run.get_id()}",
                        "reason": reason,
                    },
                )
            out = {
                "retrained": True,
                "promoted": promote,
                "reason": reason,
                "candidate_bleu": candidate.get("bleu"),
                "stages": candidate["stages"],
            }
        out["champion"] = read_champion(champion_path)
    logger().info("retrain: %s", out["reason"])
    create_markdown_artifact(_report(out, champion), key="retrain-decision")
    return out


def _report(out: dict[str, Any], before: dict[str, Any] | None) -> str:
    after = out["champion"] or {}
    return "\n".join(
        [
            f"# Retrain: {'promoted' if out['promoted'] else 'champion kept'}",
            "",
            out["reason"],
            "",
            "| | experiment | BLEU | data |",
            "|---|---|---|---|",
            *(
                f"| {label} | {c.get('experiment')} | {c.get('bleu')} | {c.get('data_hash')} |"
                for label, c in (("champion before", before or {}), ("champion now", after))
            ),
            *([f"| candidate | | {out.get('candidate_bleu')} | |"] if out["retrained"] else []),
        ]
    )
