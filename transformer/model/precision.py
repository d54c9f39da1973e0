"""Which precision a device computes in: `auto` resolved, and bf16 refused where it is emulated."""

from __future__ import annotations

import torch

from transformer.core.settings import ConfigError


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware.

    CPUs without AVX-512 BF16 or AMX (e.g. AMD Zen 3, AVX2 only) emulate bf16 GEMMs: measured
    here 0.5 GFLOP/s against 97 in fp32, so bf16 there is never worth it.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision: str, device: torch.device, key: str) -> str:
    """`auto` -> bf16 where native, else fp32; an explicit bf16 without it is an error."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        cap = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else device.type
        raise ConfigError(
            f"{key}: bf16 needs native bf16 matmuls (AVX-512 BF16 or AMX on a CPU); this "
            f"{device.type} has {cap}, where bf16 runs ~100x slower than fp32. Use fp32 (or int8 "
            "to decode), or auto to train (bf16 where native)"
        )
    return precision
