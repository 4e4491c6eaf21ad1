"""The hand-written FastAPI + timm image classifier a user would write: the baseline of `benchmarks/serve_load.py`.

A sync handler (FastAPI runs it in its thread pool), one image per forward pass, timm's own eval transform for the
model, fp32, the whole thing in one uvicorn process: what the FastAPI and timm docs lead to. The weights are the
same file vitlab serves (vitlab keeps timm's parameter names, so timm loads it with strict=True).

    .venv/bin/python benchmarks/serve_baseline_fastapi.py --weights vit_s16.safetensors --arch vit_small_patch16_224 \
        --port 8001
"""

from __future__ import annotations

import argparse

import timm
import torch
import uvicorn
from fastapi import FastAPI, File, UploadFile
from PIL import Image
from safetensors.torch import load_file


def build_app(weights: str, arch: str) -> FastAPI:
    model = timm.create_model(arch, pretrained=False)
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    app = FastAPI()

    @app.post("/predict")
    def predict(file: UploadFile = File(...)) -> dict:  # noqa: B008  (FastAPI's own idiom)
        img = Image.open(file.file).convert("RGB")
        x = transform(img).unsqueeze(0)
        with torch.no_grad():
            probs = model(x).softmax(-1)[0]
        top = probs.topk(5)
        return {"predictions": [{"top": [{"index": int(i), "prob": float(p)}
                                         for p, i in zip(top.values, top.indices)]}]}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True)
    p.add_argument("--arch", default="vit_small_patch16_224")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args()
    uvicorn.run(build_app(args.weights, args.arch), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
