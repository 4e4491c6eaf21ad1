"""The inference process: loads the model, builds its speed mode, warms it, then answers batches over a pipe.

Started by `vitlab.serving.engine.WorkerHandle` from a forkserver that has this module (and so torch) imported,
so a restart costs a fork and a model load, not an interpreter start. The protocol, one message each way:

    server -> worker   ("predict", x)        x: (B, C, H, W) float32 numpy, already preprocessed
                       ("explain", x)        x: (1, C, H, W); also the attention rollout (paper Fig. 6)
                       ("stop",)
    worker -> server   ("ready", info) | ("failed", message)               once, after start-up
                       ("ok", probs, seconds[, rollout]) | ("error", message)   per request

Only the server process writes to this pipe: nothing a client sends is unpickled (the server decodes images
itself and sends arrays). The worker ignores SIGINT and SIGTERM (the server drains, then stops it) and exits when
the server's end of the pipe closes, so a killed server leaves no worker behind.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..analysis.attention import analyze_attention
from ..data import load_images, preprocess_of
from ..deploy.optimize import optimize
from ..models.preprocess import PreprocessWarning
from ..models.vit import VisionTransformer
from ..weights import load_model

__all__ = ["BUCKETED_MODES", "WorkerSpec", "buckets", "main"]

log = logging.getLogger(__name__)

# modes whose compiled graph is specialised on the batch size: batches are padded to a few sizes, each built at
# warm-up, so no request pays a compilation
BUCKETED_MODES = ("compile", "compile-bf16", "int8-static")
_CALIB_IMAGES = 32
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker builds (picklable: sent to the new process)."""

    model: str
    mode: str
    calib: str | None
    device: str
    threads: int
    max_batch_size: int
    warmup: int
    index: int = 0


def buckets(max_batch_size: int) -> list[int]:
    """Batch sizes a bucketed mode is built for: powers of two up to the maximum, and the maximum."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return [*sizes, max_batch_size]


def _calibration(spec: WorkerSpec, model: torch.nn.Module) -> torch.Tensor | None:
    """Up to 32 images of `spec.calib` (a folder or one file), prepared as the model wants."""
    if spec.calib is None:
        return None
    root = Path(spec.calib)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"--calib {spec.calib}: no images ({', '.join(_IMAGE_SUFFIXES)})")
    pre = preprocess_of(model)
    cfg = getattr(model, "cfg", None)
    in_chans = cfg.in_chans if cfg is not None else 3
    return load_images([str(p) for p in files[:_CALIB_IMAGES]], img_size=pre.img_size, in_chans=in_chans,
                       preprocess=pre)


class _Runner:
    """The model of one worker: the speed mode for predictions, the fp32 model for rollouts."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.device = torch.device(spec.device)
        model = load_model(spec.model).eval().to(self.device)
        self.model = model
        calib = _calibration(spec, model)
        self.net: Any = model if spec.mode == "fp32" else optimize(model, spec.mode, calib=calib)
        self.mode = str(getattr(self.net, "mode", spec.mode))  # "auto" says what it chose
        self.sizes = buckets(spec.max_batch_size) if self.mode in BUCKETED_MODES else None

    def warm(self, chw: tuple[int, int, int]) -> None:
        sizes = self.sizes or sorted({1, self.spec.max_batch_size})
        for b in sizes:
            for _ in range(self.spec.warmup):
                self.predict(np.zeros((b, *chw), dtype=np.float32))

    def _padded(self, n: int) -> int:
        if self.sizes is None:
            return n
        return next((s for s in self.sizes if s >= n), n)

    @torch.inference_mode()
    def predict(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        t = torch.from_numpy(x)
        pad = self._padded(n) - n
        if pad:
            t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
        logits = self.net(t.to(self.device))
        return logits[:n].float().softmax(-1).cpu().numpy()  # (B, classes)

    def rollout(self, x: np.ndarray) -> np.ndarray | None:
        """(gh, gw) attention rollout of the class token over the patches, from the fp32 model; None for a model
        without attention (a BiT ResNet)."""
        if not isinstance(self.model, VisionTransformer):
            return None
        with torch.inference_mode():
            analysis = analyze_attention(self.model, torch.from_numpy(x).to(self.device), batch_size=1)
        return np.asarray(analysis.rollout[0], dtype=np.float32)


def main(conn: Connection, spec: WorkerSpec) -> None:
    """The worker process: build, say "ready" (or "failed" with one line), then serve until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    warnings.filterwarnings("ignore", category=PreprocessWarning)  # the server process has said it once
    torch.set_num_threads(spec.threads)
    try:
        runner = _Runner(spec)
        pre = preprocess_of(runner.model)  # the input the server will send: the checkpoint's preprocessing
        runner.warm((pre.in_chans, *pre.hw))
    except Exception as e:  # reported by the server as one line; the traceback goes to the log with -v
        log.debug("worker %d failed to start", spec.index, exc_info=True)
        conn.send(("failed", _one_line(e)))
        conn.close()
        return
    conn.send(("ready", {"pid": os.getpid(), "mode": runner.mode, "threads": spec.threads,
                         "device": str(runner.device)}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        if msg[0] == "stop":
            conn.close()
            return
        try:
            t0 = time.perf_counter()
            probs = runner.predict(msg[1])
            if msg[0] == "explain":
                rollout = runner.rollout(msg[1])
                conn.send(("ok", probs, time.perf_counter() - t0, rollout))
            else:
                conn.send(("ok", probs, time.perf_counter() - t0))
        except (EOFError, OSError, BrokenPipeError):
            return
        except Exception as e:
            traceback.print_exc()
            conn.send(("error", f"inference failed ({type(e).__name__})"))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
