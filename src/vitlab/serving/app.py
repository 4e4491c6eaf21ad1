"""The HTTP API (FastAPI on uvicorn): routes, the error format, the API key, metrics per request.

    GET  /              the page to try the model (self-contained: no CDN)
    GET  /info          model name, mode, classes, input size, limits
    GET  /health        200 {"status": "ok" | "degraded"} when a worker is ready, else 503 (starting, restarting,
                        shutting down); one entry per worker
    GET  /metrics       Prometheus text
    POST /predict       image bytes (image/*, application/octet-stream) or multipart/form-data file parts (the
                        batch form) -> top-k labels and probabilities per image
    POST /explain       one image -> top-k, the attention rollout over the patches and the model's view (the page)
    GET  /openapi.json  the OpenAPI schema; GET /docs reads it (self-contained page)

Every error is JSON, `{"error": {"kind": ..., "message": ...}}`, with a 4xx for what the client sent (400 bad
image, 401 key, 413 too large, 415 content type), 503 with Retry-After when over capacity, 500 only when inference
itself failed; never a traceback or a file-system path.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..models.preprocess import Preprocess
from ..utils.version import __version__
from .config import ServeConfig
from .engine import Engine
from .images import Preparer, RequestError, read_body, split_body
from .metrics import CONTENT_TYPE_LATEST, Metrics

__all__ = ["ModelInfo", "create_app"]

log = logging.getLogger("vitlab.serving")


@dataclass
class ModelInfo:
    """What the server process knows of the model (read once at start-up; the workers hold the weights)."""

    name: str  # as shown to clients: a registry name or Hub id as given, a checkpoint file's base name
    classes: list[str]
    preprocess: Preprocess
    architecture: str
    explainable: bool  # a ViT: the attention rollout exists


# -- the documented shapes (OpenAPI only; answers are built as plain dicts) -------------------------------------------


class ClassProb(BaseModel):
    label: str
    index: int
    prob: float


class ImagePrediction(BaseModel):
    top: list[ClassProb]
    filename: str | None = None


class PredictResponse(BaseModel):
    model: str
    mode: str
    predictions: list[ImagePrediction]
    latency_ms: float


class ExplainResponse(BaseModel):
    model: str
    mode: str
    top: list[ClassProb]
    grid: list[int] | None
    rollout: list[list[float]] | None
    view: str
    latency_ms: float


class ErrorBody(BaseModel):
    kind: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


_IMAGE_BODY = {
    "required": True,
    "content": {
        "image/*": {"schema": {"type": "string", "format": "binary"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "multipart/form-data": {"schema": {"type": "object", "properties": {
            "file": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
    },
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "empty body, not an image, corrupt or truncated image, too many "
          "pixels (a decompression bomb is refused before decoding), malformed multipart, bad parameter"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (when the server has one)"},
    413: {"model": ErrorResponse, "description": "body over the size limit, or too many images"},
    415: {"model": ErrorResponse, "description": "Content-Type is not image/*, octet-stream or multipart"},
    503: {"model": ErrorResponse, "description": "over capacity (see Retry-After) or no worker ready"},
}


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status, headers=headers)


class _Observe:
    """ASGI middleware: per request, the status code by endpoint, its latency, and errors by kind."""

    def __init__(self, app: Any, metrics: Metrics, endpoints: set[str]):
        self.app, self.metrics, self.endpoints = app, metrics, endpoints

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in self.endpoints else "other"
        started = time.perf_counter()
        status = [500]

        async def observe(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


def create_app(cfg: ServeConfig, info: ModelInfo, engine: Engine, metrics: Metrics,
               on_started: Callable[[], Coroutine[Any, Any, None]] | None = None) -> Any:
    """The ASGI app of a server: `engine` must be started (its workers warm); the app's lifespan starts the
    engine's drivers and closes it at shutdown."""
    api = _Api(cfg, info, engine, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.run()
        announcing: asyncio.Task[None] | None = None
        if on_started is not None:
            announcing = asyncio.create_task(on_started())
        try:
            yield
        finally:
            if announcing is not None:
                announcing.cancel()
            await engine.close()
            api.decode_pool.shutdown(wait=False)

    app = FastAPI(title="vitlab serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"Image classification with {info.name} ({info.architecture}). Errors are JSON "
                  '`{"error": {"kind", "message"}}`.')
    app.exception_handler(RequestError)(api.on_request_error)
    app.exception_handler(RequestValidationError)(api.on_validation)
    app.exception_handler(StarletteHTTPException)(api.on_http)
    app.exception_handler(Exception)(api.on_bug)
    _image_route(app, "/predict", PredictResponse,
                 "Classify one image (raw bytes) or several (multipart file parts)")(api.predict)
    _image_route(app, "/explain", ExplainResponse,
                 "One image: top-k, attention rollout (paper Fig. 6) and the model's view of it")(api.explain)
    app.get("/health", summary="Ready (200) once every worker is loaded and warm; 503 otherwise",
            responses={503: {"description": "no worker ready: starting, restarting or shutting down"}})(api.health)
    app.get("/metrics", summary="Prometheus metrics", response_class=Response)(api.prometheus)
    app.get("/info", summary="The model, its mode, classes, input and the server's limits")(api.about)
    app.get("/", response_class=HTMLResponse, include_in_schema=False)(page)
    app.get("/docs", response_class=HTMLResponse, include_in_schema=False)(docs)
    endpoints = {"/predict", "/explain", "/health", "/metrics", "/info", "/", "/docs", "/openapi.json"}
    return _Observe(app, metrics, endpoints)


def _image_route(app: FastAPI, path: str, answer: type[BaseModel], summary: str) -> Callable[[Any], Any]:
    """`app.post(path, ...)` for a route that takes images (raw bytes or multipart) and answers `answer`."""
    return app.post(path, response_model=None, openapi_extra={"requestBody": _IMAGE_BODY},
                    responses={200: {"model": answer}, **_ERRORS}, summary=summary)


class _Api:
    """The handlers of one app (routes and error handlers), over what they share: the config, the model's facts, the
    engine, the metrics, and the threads that decode images."""

    def __init__(self, cfg: ServeConfig, info: ModelInfo, engine: Engine, metrics: Metrics) -> None:
        self.cfg, self.info, self.engine, self.metrics = cfg, info, engine, metrics
        self.preparer = Preparer(info.preprocess, cfg.max_pixels)
        self.decode_pool = ThreadPoolExecutor(cfg.decode_threads, thread_name_prefix="vitlab-serve-decode")
        self.num_classes = len(info.classes)

    # -- errors: one JSON shape, counted by kind

    def fail(self, e: RequestError) -> JSONResponse:
        self.metrics.errors.labels(e.kind).inc()
        return _error(e.status, e.kind, e.message, e.headers)

    async def on_request_error(self, request: Request, e: RequestError) -> JSONResponse:
        return self.fail(e)

    async def on_validation(self, request: Request, e: RequestValidationError) -> JSONResponse:
        where = ", ".join(".".join(str(p) for p in err.get("loc", ())[1:]) or "request" for err in e.errors())
        return self.fail(RequestError(400, "bad_parameter", f"bad value for {where}"))

    async def on_http(self, request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return self.fail(RequestError(e.status_code, kind, str(e.detail)))

    async def on_bug(self, request: Request, e: Exception) -> JSONResponse:
        log.error("internal error answering %s %s", request.method, request.url.path, exc_info=e)
        return self.fail(RequestError(500, "internal", "internal error"))

    # -- what the image routes share

    def authorize(self, request: Request) -> None:
        if self.cfg.api_key is None:
            return
        given = request.headers.get("x-api-key")
        if given is None:
            scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else None
        if given is None or not hmac.compare_digest(given.encode(), self.cfg.api_key.encode()):
            raise RequestError(401, "unauthorized", "a valid API key is needed (X-API-Key or Authorization: Bearer)",
                               {"WWW-Authenticate": "Bearer"})

    async def images_of(self, request: Request) -> tuple[list[np.ndarray], list[str | None]]:
        try:
            body = await read_body(request.headers, request.stream(), self.cfg.max_body_bytes)
        except ClientDisconnect:  # nobody to answer; counted, not logged as a fault
            raise RequestError(400, "client_disconnected", "the client left before its body arrived") from None
        images = await split_body(request.headers, body, self.cfg.max_images)
        del body
        loop = asyncio.get_running_loop()
        xs = await asyncio.gather(*(loop.run_in_executor(self.decode_pool, self.preparer, im) for im in images))
        return list(xs), [im.filename for im in images]

    def top(self, probs: np.ndarray, k: int) -> list[dict[str, Any]]:
        k = min(k, self.num_classes)
        idx = np.argpartition(-probs, k - 1)[:k] if k < self.num_classes else np.arange(self.num_classes)
        idx = idx[np.argsort(-probs[idx], kind="stable")]
        return [{"label": self.info.classes[i], "index": int(i), "prob": float(probs[i])} for i in idx]

    # -- the routes

    async def predict(self, request: Request, top_k: int | None = Query(None, ge=1, le=100_000)) -> JSONResponse:
        started = time.perf_counter()
        self.authorize(request)
        with self.engine.admit():
            xs, names = await self.images_of(request)
            probs = await self.engine.predict(xs)
        k = top_k or self.cfg.top_k
        predictions = [{"top": self.top(p, k), **({"filename": n} if n else {})} for p, n in zip(probs, names)]
        return JSONResponse({"model": self.info.name, "mode": self.engine.mode(), "predictions": predictions,
                             "latency_ms": round(1000 * (time.perf_counter() - started), 2)})

    async def explain(self, request: Request, top_k: int | None = Query(None, ge=1, le=100_000)) -> JSONResponse:
        started = time.perf_counter()
        self.authorize(request)
        with self.engine.admit():
            xs, _ = await self.images_of(request)
            if len(xs) != 1:
                raise RequestError(400, "one_image", f"/explain takes one image, got {len(xs)}")
            probs, rollout = await self.engine.explain(xs[0])
            view = await asyncio.get_running_loop().run_in_executor(self.decode_pool, self.preparer.view, xs[0])
        grid = list(rollout.shape) if rollout is not None else None
        return JSONResponse({
            "model": self.info.name, "mode": self.engine.mode(), "top": self.top(probs, top_k or self.cfg.top_k),
            "grid": grid, "rollout": np.round(rollout, 6).tolist() if rollout is not None else None,
            "view": "data:image/png;base64," + base64.b64encode(view).decode(),
            "latency_ms": round(1000 * (time.perf_counter() - started), 2)})

    async def health(self) -> JSONResponse:
        status, workers = self.engine.health()
        code = 200 if status in ("ok", "degraded") else 503
        return JSONResponse({"status": status, "workers": workers, "queue_depth": self.engine.queue_depth,
                             "in_flight": self.engine.in_flight}, status_code=code)

    async def prometheus(self, request: Request) -> Response:
        self.authorize(request)
        self.metrics.queue_depth.set(self.engine.queue_depth)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def about(self) -> JSONResponse:
        h, w = self.info.preprocess.hw
        cfg = self.cfg
        return JSONResponse({
            "model": self.info.name, "architecture": self.info.architecture, "mode": self.engine.mode(),
            "num_classes": self.num_classes, "input": [self.info.preprocess.in_chans, h, w],
            "preprocess": self.info.preprocess.describe(), "explain": self.info.explainable, "top_k": cfg.top_k,
            "workers": len(self.engine.workers), "max_batch_size": cfg.max_batch_size,
            "max_body_bytes": cfg.max_body_bytes, "max_images": cfg.max_images, "auth": cfg.api_key is not None,
            "version": __version__})


async def page() -> HTMLResponse:
    return HTMLResponse(_asset("page.html"))


async def docs() -> HTMLResponse:
    return HTMLResponse(_asset("docs.html"))


def _asset(name: str) -> str:
    return resources.files("vitlab.serving").joinpath(name).read_text(encoding="utf-8")
