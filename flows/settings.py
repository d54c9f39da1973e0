"""The flows' own section of params.yaml (`retrain`): read by the promotion gate, no stage.

Here, not in transformer/sections/, so that no stage depends on it: a new gate setting
reruns nothing. transformer/config.py lists it among params.yaml's sections (`check`, presets).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer.settings import ConfigError


@dataclass
class RetrainConfig:
    """The promotion gate. The champion is a git tag (flows/registry.py), not a setting."""

    margin: float = 0.0  # promote a candidate only if its BLEU beats the champion's by more

    def __post_init__(self) -> None:
        if not 0 <= self.margin < float("inf"):  # NaN too: it would never promote
            raise ConfigError(f"retrain.margin must be a number >= 0, got {self.margin}")
