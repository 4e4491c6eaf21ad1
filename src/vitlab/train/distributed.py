"""Data-parallel set-up: the same command runs alone or under `torchrun` (one or many nodes).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK and the rendezvous (MASTER_ADDR / MASTER_PORT or --rdzv-endpoint);
we read them, start the process group (NCCL on GPUs, gloo on CPUs) and wrap the model in DDP, or in FSDP
(`fully_shard` per block, for the large variants whose optimizer state does not fit on one device).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    """Where this process sits: rank among world_size processes, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (an immutable default)
    owns_group: bool = False  # this call started the process group, so it is the one to end it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed(device: str | None = None) -> DistInfo:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1); otherwise a single process.

    Args:
        device: "cpu" or "cuda"; None picks CUDA when available.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but CUDA is not available")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise RuntimeError(f"WORLD_SIZE={world_size} but {var} is not set: launch with torchrun")
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
        return DistInfo(rank, world_size, local_rank, dev, owns_group=True)
    return DistInfo(rank, world_size, local_rank, dev)


def teardown_distributed(info: DistInfo) -> None:
    """End the process group `setup_distributed` started, after every process has reached this point.

    The barrier makes sure no process closes its connections while a peer's last collective (FSDP's final
    gather) is still in flight, and destroying the group before the interpreter exits stops gloo's worker threads
    cleanly; without both, a process can die with "terminate called without an active exception" (SIGABRT).
    A group the caller started is left to the caller.
    """
    if info.owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, info: DistInfo, parallel: str) -> nn.Module:
    """DDP (a full replica per process) or FSDP (parameters, grads and optimizer state sharded per block)."""
    if not info.distributed:
        return model
    if parallel == "ddp":
        ids = [info.device.index] if info.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in cast(nn.ModuleList, model.blocks):
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"unknown parallel mode {parallel!r}; valid: ddp, fsdp")


def unwrap(model: nn.Module) -> nn.Module:
    """The VisionTransformer inside DDP / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def full_state_dict(model: nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The whole model's state dict on the CPU (gathered from all shards under FSDP; every rank must call)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if info.distributed:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return cast(dict[str, torch.Tensor], get_model_state_dict(unwrap(model), options=opts))
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def all_reduce_mean(value: float, info: DistInfo) -> float:
    """Mean of a float over processes."""
    if not info.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.item() / info.world_size


def all_true(flag: bool, info: DistInfo) -> bool:
    """True only when every process says True (all processes then take the same branch)."""
    if not info.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every process's `obj`, in rank order (the data position and RNGs differ per rank)."""
    if not info.distributed:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def optimizer_state_dict(optimizer: torch.optim.Optimizer, net: nn.Module, info: DistInfo, parallel: str) -> Any:
    """The optimizer's whole state (gathered to full tensors on the CPU under FSDP; every rank must call)."""
    if info.distributed and parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(net, optimizer, options=opts)
    return optimizer.state_dict()


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, net: nn.Module, state: Any, info: DistInfo,
                              parallel: str) -> None:
    """Load what `optimizer_state_dict` returned (sharded again under FSDP)."""
    if info.distributed and parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(net, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)
