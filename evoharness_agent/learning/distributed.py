"""Data-parallel training: one process per device, gradients all-reduced, rank 0 writes.

Every rank holds the data set and draws the same global batch (one generator, one seed); each
trains on its own contiguous slice of that batch (:meth:`Context.shard`). The losses are means
over the batch, so the mean of the ranks' gradients on equal slices is the gradient of the
mean loss over the global batch: N processes follow the one-process run at the same global
batch, up to float summation order (and dropout, whose masks fall on different rows).

Processes come from ``torchrun`` (its ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*``
variables) or from :func:`launch` (``torch.multiprocessing.spawn`` with the same variables);
the backend is gloo on CPU and nccl on GPU.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["Context", "batch_mean", "launch", "start"]


@dataclass(frozen=True)
class Context:
    """Where this process stands in a data-parallel run (rank 0 of 1 when alone)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False
    """Whether :func:`start` created the process group (and :meth:`close` must destroy it)."""

    @property
    def is_main(self) -> bool:
        """Whether this process writes checkpoints, the policy and the logs."""
        return self.rank == 0

    def shard(self, global_batch: int) -> slice:
        """Return this rank's contiguous slice of a global batch of ``global_batch`` rows."""
        if global_batch % self.world_size:
            raise ValueError(f"training.batch_size {global_batch} is not divisible by the "
                             f"{self.world_size} processes (the global batch is split evenly)")
        size = global_batch // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def all_reduce_gradients(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Average the gradients of ``optimizer``'s parameters over ranks, in one flat buffer.

        Its signature is an optimizer step pre-hook's (``optimizer, args, kwargs``). Parameters
        without a gradient are the same on every rank (the same code path ran), so skipping
        them keeps the buffers aligned.
        """
        if self.world_size == 1:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def mean(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Average scalar ``values`` over ranks (every rank must call this at the same step)."""
        if self.world_size == 1 or not values:
            return values
        stacked = torch.stack([v.detach().float().reshape(()) for v in values.values()])
        dist.all_reduce(stacked)
        stacked /= self.world_size
        return dict(zip(values, stacked, strict=True))

    def broadcast(self, modules: list[torch.nn.Module]) -> None:
        """Give every rank rank 0's parameters and buffers (after init, ``--init`` or a resume)."""
        if self.world_size == 1:
            return
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        """Wait for every rank (no-op when alone)."""
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        """Destroy the process group if :func:`start` created it."""
        if self.owns_group:
            dist.destroy_process_group()


def batch_mean(values: torch.Tensor) -> torch.Tensor:
    """Return the mean of ``values`` over the global batch: over every rank's slice in a data-parallel run.

    For the batch statistics a loss normalises by (IQL's advantage weights): the slices are
    equal, so the mean of the ranks' means is the global batch's. No gradient flows through
    the all-reduce; pass detached values.
    """
    mean = values.mean()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        mean = mean.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
    return mean


def start(device: str) -> tuple[Context, str]:
    """Join the data-parallel run described by the environment, if any; return it and this rank's device.

    Without ``WORLD_SIZE`` (or with 1) this is a single process on ``device``. On CUDA each
    rank takes ``cuda:LOCAL_RANK``.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Context(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda")
    if cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    return Context(rank, world_size, local_rank, owns), device


def _free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _worker(local_rank: int, world_size: int, port: int, fn: Callable[..., Any],
            args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run ``fn`` as rank ``local_rank`` of a one-machine group (what torchrun's variables say)."""
    os.environ.update({"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    fn(*args, **kwargs)


def launch(nproc: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` in ``nproc`` spawned processes on this machine, as torchrun would.

    ``fn`` and its arguments must be picklable (a module-level function). Raises what a
    process raised (``torch.multiprocessing.ProcessRaisedException``).
    """
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, not {nproc}")
    if nproc == 1:
        fn(*args, **kwargs)
        return
    mp.spawn(_worker, args=(nproc, _free_port(), fn, args, kwargs), nprocs=nproc, join=True)
