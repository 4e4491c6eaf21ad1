"""`vitlab.serve(...)`: start-up in an order that never leaves a half-up server, then uvicorn until SIGTERM.

1. The port is bound (not yet listening): a port in use fails at once.
2. The model is loaded here once, to check it and read its classes and preprocessing (a checkpoint that cannot
   load raises now: `vitlab serve` prints one line and exits 1), while the forkserver imports torch beside it.
3. The workers start, build the speed mode and warm up (each batch size of a compiled mode); any failure stops
   them all and raises.
4. Only then does the socket listen: `/health` is 200 from the first request it can answer.

SIGTERM (and Ctrl-C): uvicorn stops accepting, waits up to `drain_timeout` for the requests in flight (their
images are still batched and answered), then the workers are stopped. `serve` returns (exit 0) after SIGTERM and
raises KeyboardInterrupt after Ctrl-C (exit 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data import preprocess_of
from ..data.labels import class_names
from ..models.vit import VisionTransformer
from ..utils.extras import needs
from ..weights import hub, load_model, read_metadata
from .config import ServeConfig
from .engine import Engine, _mp_context
from .worker import WorkerSpec

if TYPE_CHECKING:
    from .app import ModelInfo

__all__ = ["display_name", "load_info", "run", "serve"]

log = logging.getLogger("vitlab.serving")


def serve(model: str | Path, **options: Any) -> None:
    """Serve `model` over HTTP until SIGTERM or Ctrl-C (see `ServeConfig` for every option).

        vitlab.serve("runs/fmnist/model.safetensors", mode="int8", port=8080, workers=2)

    Args:
        model: Anything `vitlab.load_model` reads: a checkpoint file or folder, a registry name, a Hub id.
        options: `ServeConfig` fields: mode, calib, device, host, port, workers, threads, max_batch_size,
            batch_timeout, top_k, max_queue, max_images, max_body_mb, max_pixels, decode_threads, drain_timeout,
            api_key, warmup.

    Raises:
        ValueError: A bad option, or a calibrated mode without `calib`.
        FileNotFoundError / vitlab.weights.WeightsError: The checkpoint cannot be found or read.
        RuntimeError: The port cannot be bound, or a worker cannot build the mode (vitlab.serving.WorkerFailed).
        MissingExtraError: The `serve` extra is not installed.
        KeyboardInterrupt: Stopped by Ctrl-C (after draining).
    """
    run(ServeConfig(str(model), **options))


def display_name(model: str) -> str:
    """How clients see the model: a local checkpoint by its base name (no file-system path leaves the server), any
    other name as given."""
    path = Path(model)
    with contextlib.suppress(OSError):
        if path.exists():
            return path.name or str(model)
    return model


def load_info(cfg: ServeConfig) -> ModelInfo:
    """Load the checkpoint once in this process: it must load (else raise, before anything listens); its classes,
    preprocessing and architecture."""
    from .app import ModelInfo

    model = load_model(cfg.model)
    meta = dict(read_metadata(cfg.model) or {})
    entry = hub.resolve(cfg.model).entry  # a registry name says its label set
    if entry is not None and getattr(entry, "labels", None):
        meta.setdefault("labels", entry.labels)
    classes = class_names(meta, model.cfg.num_classes)
    name = display_name(cfg.model)
    pre = preprocess_of(model, what=name)
    arch = getattr(model.cfg, "name", None) or type(model).__name__
    info = ModelInfo(name, classes, pre, str(arch), isinstance(model, VisionTransformer))
    del model
    return info


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(False)
    return sock


def run(cfg: ServeConfig) -> None:
    """`serve` with a ready `ServeConfig`."""
    cfg.check()
    with needs("serve", "vitlab serve"):  # the extra's modules, checked before any work
        import uvicorn

        from .app import create_app
        from .metrics import Metrics
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sock = _bind(cfg.host, cfg.port)
    try:
        from multiprocessing import forkserver

        _mp_context()
        threading.Thread(target=forkserver.ensure_running, daemon=True).start()  # imports torch beside our load
        torch.set_num_threads(1)  # this process decodes and preprocesses; the workers get the cores
        info = load_info(cfg)
        threads = cfg.threads_per_worker()
        specs = [WorkerSpec(cfg.model, cfg.mode, cfg.calib, device, threads, cfg.max_batch_size, cfg.warmup, i)
                 for i in range(cfg.workers)]
        metrics = Metrics(cfg.max_batch_size)
        engine = Engine(specs, max_batch_size=cfg.max_batch_size, batch_timeout=cfg.batch_timeout,
                        max_queue=cfg.max_queue, metrics=metrics)
        engine.start()
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    server: Any = None

    async def announce() -> None:
        while server is not None and not server.started:
            await asyncio.sleep(0.01)
        url_host = f"[{host}]" if ":" in host else host
        log.info("vitlab serve: %s (%s, mode %s, %d worker(s) x %d thread(s), batches up to %d) on http://%s:%d",
                 info.name, info.architecture, engine.mode(), cfg.workers, threads, cfg.max_batch_size, url_host,
                 port)

    app = create_app(cfg, info, engine, metrics, on_started=announce)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(cfg.drain_timeout), timeout_keep_alive=5,
                            limit_max_requests=None, server_header=False)
    server = uvicorn.Server(config)
    received: list[int] = []

    def remember(signum: int, frame: Any) -> None:  # uvicorn re-raises the signal it drained for: noted, not fatal
        received.append(signum)

    previous = {s: signal.signal(s, remember) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    except SystemExit as e:  # uvicorn's own start-up failure (its message is logged)
        raise RuntimeError(f"the HTTP server could not start (code {e.code})") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sock.close()
        for w in engine.workers:  # normally stopped by the app's shutdown already
            if w.alive():
                w.stop(timeout=5)
    log.info("vitlab serve: stopped")
    if signal.SIGINT in received:
        raise KeyboardInterrupt
