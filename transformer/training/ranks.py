"""A training job's processes: this process's device, autocast dtype and, under ``torchrun``, its rank in
the process group, with the collectives the training loop needs.
"""

import math
import os
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from transformer.runtime.memory import keep_freed_memory
from transformer.runtime.precision import (
    DeviceError,
    autocast,
    autocast_dtype,
    resolve_device,
    size_onednn_cache,
    training_precision,
)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def shard(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's share of an epoch's batches (``make_batches``, called alike by every rank): rank r takes
    batches r, r + world_size, ...; so that all ranks take the same number of steps, the list is first
    padded by repeating batches from its start, which then appear twice in the epoch."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not batches:
        return []
    n_per_rank = math.ceil(len(batches) / world_size)
    padded = [batches[k % len(batches)] for k in range(n_per_rank * world_size)]
    return padded[rank::world_size]


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32
    rank: int = 0
    world_size: int = 1
    # a CPU (gloo) group with a long timeout, for the ranks that wait while rank 0 validates
    waiting_group: object = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` of all processes (a collective: every rank must call it)."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over all processes (a collective)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def gather(self, obj: object) -> list:
        """Every process's ``obj``, in rank order (a collective)."""
        if self.world_size == 1:
            return [obj]
        objects = [None] * self.world_size
        dist.all_gather_object(objects, obj)
        return objects

    def wait_for_main(self) -> None:
        """All ranks meet here; the others may wait as long as rank 0 validates (NCCL's own timeout is
        10 minutes, so the wait goes through a CPU group with a timeout of a day)."""
        if self.world_size > 1:
            dist.barrier(group=self.waiting_group)

    def close(self) -> None:
        """Wait for every process (rank 0 may be testing: the long-timeout wait), then leave the group."""
        if self.world_size > 1:
            self.wait_for_main()
            dist.destroy_process_group()

    def autocast(self):
        return autocast(self.device, self.dtype)

    @property
    def precision(self) -> str:
        """The precision training runs in, by name ("fp32", "bf16", "fp16"): what validation decodes in."""
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]


def setup_runtime(device_name: str, precision: str) -> Runtime:
    """Device, precision, TF32, and the process group when started by ``torchrun``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    waiting_group = None
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        waiting_group = dist.new_group(backend="gloo", timeout=timedelta(days=1))
    dtype = autocast_dtype(training_precision(precision, device), device)
    size_onednn_cache(device, dtype)
    keep_freed_memory(device)
    runtime = Runtime(device, dtype, rank, world_size, waiting_group)
    if len(chosen := set(runtime.gather(runtime.precision))) > 1:  # "auto" on machines with other CPUs
        raise DeviceError(f"train.precision={precision} resolves differently across the ranks' machines "
                         f"({', '.join(sorted(chosen))}): set one of them")  # fmt: skip
    return runtime
