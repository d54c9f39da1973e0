"""The process group: the only module importing torch.distributed (setup and the few collectives).

Launched by `torchrun`, each process reads RANK / WORLD_SIZE / LOCAL_RANK from the environment
(single node: `--standalone --nproc_per_node=N`; multi-node: `--nnodes --rdzv_endpoint ...`).
Without torchrun it is one process with no process group, and every helper is a no-op.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_host_group = None  # gloo beside NCCL: collectives on CPU tensors (see all_reduce_host)


def init() -> tuple[int, int, torch.device]:
    """(rank, world_size, device); NCCL with one GPU per process when CUDA exists, gloo on CPU."""
    global _host_group
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
        if backend == "nccl":  # every rank creates every group, in the same order
            _host_group = dist.new_group(backend="gloo")
    return rank, world, device


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def is_main() -> bool:
    return rank() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    if is_main():
        print(*args, **kwargs, flush=True)


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP when there are several processes, else the model itself."""
    if not is_dist():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over processes (a no-op alone)."""
    if is_dist():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_host(t: torch.Tensor) -> torch.Tensor:
    """In-place sum of a CPU tensor over processes (a no-op alone). Under NCCL it runs on a gloo
    group, so that it neither waits for the GPU's queued work nor makes the host wait for it."""
    if is_dist():
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_host_group)
    return t


def all_gather_object(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...]; [obj] alone."""
    if not is_dist():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def destroy() -> None:
    global _host_group
    if is_dist():
        dist.destroy_process_group()  # every group, the gloo one beside NCCL too
    _host_group = None


def run(main: Callable[[], None]) -> NoReturn:
    """main() as a program, ending with the status its sys.exit gives (0 when it returns). One
    of several ranks ends without the interpreter's finalization, where a gloo thread still
    releasing a collective's tensors would take the GIL and abort a finished run ("terminate
    called without an active exception": pytorch/pytorch#190489). Other exceptions propagate
    as usual."""
    try:
        main()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        sys.exit(code)
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s obj on every rank; obj itself alone."""
    if not is_dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
