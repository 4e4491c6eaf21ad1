"""`ServeConfig`: every knob of `vitlab serve`, checked in one place (torch-free, so the command line can build it
before anything heavy is imported)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ALLOWED_FORMATS", "MODES", "ServeConfig", "cpu_count"]

# `vitlab.deploy.modes.MODES`, spelled out so the command line can offer them without importing torch (a test keeps
# the two equal)
MODES = ("fp32", "bf16", "fp16", "compile", "compile-bf16", "int8", "int8-static", "openvino", "openvino-int8", "ort",
         "ort-int8", "ort-int8-dynamic", "auto")

# What PIL may open from a request (`Image.open(..., formats=...)`): the formats the API promises, nothing else
# (PIL would otherwise try every plugin it has, FITS, PSD, EPS among them). MPO is the multi-picture JPEG that
# many cameras write; PIL identifies it as its own format.
ALLOWED_FORMATS = ("JPEG", "MPO", "PNG", "WEBP", "BMP", "TIFF", "GIF")


def cpu_count() -> int:
    """The cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class ServeConfig:
    """How `vitlab.serve` runs a model. Every field is a `vitlab serve` option of the same name.

    Attributes:
        model: Anything `vitlab.load_model` reads: a checkpoint file or folder, a registry name, a Hub id.
        mode: A `vitlab.optimize` mode ("fp32" runs the model as loaded; the calibrated ones need `calib`).
        calib: A folder of real images (or one image file) to calibrate the int8 modes and check "auto" on.
        device: "cpu", "cuda", "cuda:1"; None: cuda when available, else cpu.
        host: Interface to bind; 127.0.0.1 unless the caller says otherwise.
        port: TCP port; 0 picks a free one (the ready line says which).
        workers: Inference processes, each with its own copy of the model, restarted when one dies.
        threads: torch threads per worker (None: the cores divided among the workers).
        max_batch_size: Images one forward pass takes at most (dynamic batching).
        batch_timeout: Seconds a worker waits for a batch to fill once its first image is queued.
        top_k: Classes answered per image unless the request asks otherwise (`?top_k=`).
        max_queue: Requests admitted at once (decoding, queued or running); one more gets 503 with Retry-After.
        max_images: Images one request may carry (the multipart batch form).
        max_body_mb: Largest request body in MB (10**6 bytes); a larger one gets 413 before it is read.
        max_pixels: Largest image (width x height) decoded; a larger header is refused before any pixel is.
        decode_threads: Threads decoding and preprocessing images in the server process.
        drain_timeout: Seconds SIGTERM waits for requests in flight before the workers are stopped.
        api_key: When set, /predict, /explain and /metrics want it (`X-API-Key: KEY` or `Authorization:
            Bearer KEY`); 401 otherwise.
        warmup: Forward passes at each batch size before the server is ready.
    """

    model: str
    mode: str = "fp32"
    calib: str | None = None
    device: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    threads: int | None = None
    max_batch_size: int = 16
    batch_timeout: float = 0.01
    top_k: int = 5
    max_queue: int = 64
    max_images: int = 16
    max_body_mb: float = 20.0
    max_pixels: int = 40_000_000
    decode_threads: int = 2
    drain_timeout: float = 30.0
    api_key: str | None = field(default=None, repr=False)
    warmup: int = 1

    def __post_init__(self) -> None:
        self.model = str(self.model)
        if self.calib is not None:
            self.calib = str(self.calib)

    def check(self) -> ServeConfig:
        """ValueError naming the first bad field; returns self."""
        from ..deploy.modes import CALIBRATED_MODES  # imports torch: only here, not at import time

        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.mode in CALIBRATED_MODES and self.calib is None:
            raise ValueError(f"mode {self.mode!r} needs calibration images: --calib DIR (a few real images)")
        if self.calib is not None and not Path(self.calib).exists():
            raise ValueError(f"--calib {self.calib}: no such file or folder")
        positive = {"workers": self.workers, "max_batch_size": self.max_batch_size, "top_k": self.top_k,
                    "max_queue": self.max_queue, "max_images": self.max_images, "max_pixels": self.max_pixels,
                    "decode_threads": self.decode_threads, "threads": self.threads or 1}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name, number in (("batch_timeout", self.batch_timeout), ("drain_timeout", self.drain_timeout),
                             ("warmup", self.warmup)):
            if number < 0:
                raise ValueError(f"{name} must be >= 0, got {number}")
        if self.max_body_mb <= 0:
            raise ValueError(f"max_body_mb must be > 0, got {self.max_body_mb}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.host != "localhost":
            try:
                ipaddress.ip_address(self.host)
            except ValueError:
                raise ValueError(f"host must be an IP address or localhost, got {self.host!r}") from None
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key is empty")
        return self

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1_000_000)

    def threads_per_worker(self) -> int:
        return self.threads or max(1, cpu_count() // self.workers)

    def replace(self, **changes: object) -> ServeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
