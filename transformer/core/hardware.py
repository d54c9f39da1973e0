"""Where and how a model was trained: the record the train stage keeps (`trained_on`, in its
metrics and every checkpoint) and the package copies into lineage.json and the model card.

    {"device": "NVIDIA H200", "device_type": "cuda", "precision": "bf16", "processes": 1,
     "update": "captured", "eager_shapes": 0, "torch": "2.7.1"}

`update` is the path the updates actually took: eager, captured (a CUDA graph per batch shape),
compiled (torch.compile'd loss), or both ("captured+compiled"); `eager_shapes` counts the batch
shapes whose capture or replay failed and that ran eagerly instead (training/graphs.py). Torch-free:
the train stage passes the GPU's name (torch.cuda.get_device_name).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

KEY = "trained_on"  # in the train stage's metrics, its checkpoints, model.pt and lineage.json


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows, else "CPU"."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def record(
    device_type: str,
    gpu_name: str | None,
    precision: str,
    processes: int,
    update: str,
    eager_shapes: int,
    torch_version: str,
) -> dict[str, Any]:
    """The record (see the module's docstring); the device is the CPU's name without a GPU."""
    return {
        "device": gpu_name if device_type == "cuda" and gpu_name else cpu_name(),
        "device_type": device_type,
        "precision": precision,
        "processes": processes,
        "update": update,
        "eager_shapes": eager_shapes,
        "torch": torch_version,
    }


def text(rec: dict[str, Any] | None) -> str:
    """The record in words, for the model card's Hardware line."""
    if not rec:
        return "not recorded (trained before the train stage recorded its device)"
    n = int(rec.get("processes") or 1)
    shapes = int(rec.get("eager_shapes") or 0)
    fell_back = f" ({shapes} batch shape(s) fell back to eager)" if shapes else ""
    return (
        f"{rec.get('device')} ({rec.get('device_type')}), {n} process{'es' if n > 1 else ''}, "
        f"{rec.get('precision')}, {rec.get('update')} update{fell_back}, torch {rec.get('torch')}"
    )
