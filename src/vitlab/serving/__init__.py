"""`vitlab serve`: a checkpoint behind an HTTP API with dynamic batching, bounded queue, restarts and a page.

    import vitlab
    vitlab.serve("runs/fmnist/model.safetensors", mode="int8", port=8080)   # blocks until SIGTERM / Ctrl-C

    $ vitlab serve vit_b_16.IMAGENET1K_V1 --mode int8 --workers 2
    $ curl -F file=@cat.jpg http://127.0.0.1:8000/predict

Modules, top to bottom: `server` (start-up order, uvicorn, signals), `app` (routes, errors, API key), `engine`
(worker processes, the queue, dynamic batching, admission, restarts), `worker` (the model in its own process),
`images` (request bodies -> checked, decoded, preprocessed images), `metrics` (Prometheus), `config`
(`ServeConfig`, torch-free). Design, limits and measurements: docs/serving.md.
"""

from typing import TYPE_CHECKING, Any

from .config import MODES, ServeConfig

if TYPE_CHECKING:
    from .server import serve

__all__ = ["MODES", "ServeConfig", "serve"]


def __getattr__(name: str) -> Any:
    if name == "serve":  # imported on first use: `vitlab serve --help` builds its parser without torch
        from .server import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
