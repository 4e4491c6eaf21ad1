"""What the training log reports about speed: images/s, model FLOPs utilisation (MFU) and the time left.

MFU (PaLM, App. B; nanoGPT prints it) is the model's FLOPs per second (`vitlab.models.flops.count_flops`, forward +
backward) over the machine's peak. The peak is measured, not looked up: a short dense matmul probe in the run's
precision, once per process and device kind (cached), so the number means "fraction of what this machine's matmul
units reach here", on any CPU or GPU.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from ..models.config import ViTConfig
from ..models.flops import count_flops
from ..models.resnet import ResNetConfig


@functools.cache
def peak_flops(device_type: str = "cpu", precision: str = "fp32", *, seconds: float = 0.2) -> float:
    """`measure_peak`, cached per process."""
    return measure_peak(device_type, precision, seconds=seconds)


def measure_peak(device_type: str = "cpu", precision: str = "fp32", *, seconds: float = 0.2) -> float:
    """Measured peak FLOP/s of a square matmul on `device_type` in `precision` ("bf16" or "fp32"): the best of
    repeated multiplies over about `seconds` (at least three), after one warm-up."""
    n = 4096 if device_type == "cuda" else 1024
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device_type, dtype)
    b = torch.randn(n, n, generator=g).to(device_type, dtype)

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    torch.mm(a, b)  # warm-up (kernel selection, page faults)
    sync()
    best = float("inf")
    start = time.perf_counter()
    reps = 0
    while reps < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2 * n**3 / best


@dataclass
class Speed:
    """One log interval's speed figures."""

    images_per_s: float
    mfu: float
    eta_s: float


class Meter:
    """Turns training time and images into images/s, MFU and ETA for the log rows.

    Args:
        cfg: The model's config (FLOPs per image come from it, at the size the images are fed at).
        device_type: "cpu" / "cuda" (for the peak).
        precision: The run's resolved precision (the peak is measured in it).
        world_size: Processes training together (the peak is per process).
    """

    def __init__(self, cfg: ViTConfig | ResNetConfig, device_type: str, precision: str, world_size: int = 1) -> None:
        self.cfg = cfg
        self._probe = (device_type, precision, world_size)
        self.peak = peak_flops(device_type, precision) * world_size
        self._reprobed = False
        self._time = 0.0  # training seconds at the last `interval` call
        self._images = 0
        self._start = (0.0, 0)  # (training seconds, step) when this process started: see `start`

    def interval(self, train_time_s: float, images_seen: int, step: int, total_steps: int,
                 hw: tuple[int, int]) -> Speed:
        """Speed since the previous call (or since the first one seen), and the ETA at this process's pace."""
        dt, di = train_time_s - self._time, images_seen - self._images
        self._time, self._images = train_time_s, images_seen
        ips = di / dt if dt > 0 else 0.0
        achieved = ips * count_flops(self.cfg, hw, backward=True)
        if achieved > self.peak and not self._reprobed:
            # the probe ran while something else held the cores (a busy machine at start-up): measure again, longer
            self._reprobed = True
            device_type, precision, world_size = self._probe
            again = measure_peak(device_type, precision, seconds=1.0) * world_size
            self.peak = max(self.peak, again)
        mfu = achieved / self.peak
        t0, s0 = self._start
        steps_here = step - s0
        eta = (train_time_s - t0) / steps_here * (total_steps - step) if steps_here > 0 else float("nan")
        return Speed(images_per_s=ips, mfu=mfu, eta_s=eta)

    def start(self, train_time_s: float, images_seen: int, step: int) -> None:
        """Begin measuring from a run's current counters (a resumed run starts mid-way)."""
        self._time, self._images = train_time_s, images_seen
        self._start = (train_time_s, step)
