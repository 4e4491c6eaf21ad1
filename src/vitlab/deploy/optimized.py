"""`OptimizedModel`: what every speed mode returns (`vitlab.optimize`): fp32 images in, fp32 logits out, inference
only, whatever the mode computes in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class OptimizedModel(nn.Module):
    """An inference-only wrapper: casts the input to the compute dtype and the logits back to fp32.

    Attributes:
        module: The converted model (a copy; the original is left untouched).
        mode: The speed mode it was built with.
        dtype: The floating dtype it computes in.
    """

    def __init__(self, module: nn.Module, mode: str, dtype: torch.dtype, compiled: Callable[..., Any] | None = None):
        super().__init__()
        self.module = module
        self.mode = mode
        self.dtype = dtype
        self._run = compiled if compiled is not None else module
        self.auto_report: Any = None  # mode "auto": its vitlab.deploy.autoselect.AutoReport (candidates, timings, ...)
        super().train(False)  # born in eval mode: callers that save and restore `.training` never ask for train

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.to(self.dtype)).float()  # (B, num_classes) in fp32

    def train(self, mode: bool = True) -> OptimizedModel:
        if mode:
            raise RuntimeError(f"an optimize(mode={self.mode!r}) model is for inference only; train the original")
        return super().train(False)

    def extra_repr(self) -> str:
        meta = getattr(self.module, "meta", {})
        attention = meta.get("attention_dtype")  # int8-static: what attention ran in (and how, when written out)
        kernel = f" ({meta['attention_kernel']})" if attention and meta.get("attention_kernel") else ""
        outputs = f", linear outputs={meta['outputs_dtype']}" if meta.get("outputs_dtype") else ""
        layernorm = f", layernorm={meta['layernorm_kernel']}" if meta.get("layernorm_kernel") else ""
        gemm = f", gemm={meta['gemm_kernel']}" if meta.get("gemm_kernel") else ""
        return (f"mode={self.mode!r}, dtype={self.dtype}" + (f", attention={attention}{kernel}" if attention else "")
                + outputs + layernorm + gemm)
