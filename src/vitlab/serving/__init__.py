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

from .config import ServeConfig
from .server import serve

__all__ = ["ServeConfig", "serve"]
