"""ONNX export: an ONNX graph with a dynamic batch, checked against PyTorch (`vitlab export` on the command line).

    report = export_onnx(vitlab.load_model("runs/finetune/model.safetensors"), "vit.onnx")  # verified, batch 1, 3
    python -c "import onnxruntime as ort; ort.InferenceSession('vit.onnx').run(None, {'images': x})"

The graph comes from `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), the exporter PyTorch
maintains; the input is named `images` (B, C, H, W) with B symbolic, the output `logits` (B, num_classes).
The file is written into a temporary folder beside the destination and moved into place only after it has been
verified, so a failed export never leaves a half-written or clobbered file.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ._extras import require
from .config import to_hw
from .io import output_error, place
from .model import VisionTransformer

DEFAULT_OPSET = 18


@dataclass
class ExportReport:
    """What `export_onnx` wrote and how closely onnxruntime reproduces PyTorch."""

    path: Path
    files: list[Path]
    input_shape: tuple[str | int, ...]
    max_abs_diff: dict[int, float]  # batch size -> max |onnxruntime - torch| over the logits

    def summary(self) -> str:
        diffs = ", ".join(f"batch {b}: {d:.2e}" for b, d in self.max_abs_diff.items()) or "not verified"
        size = sum(f.stat().st_size for f in self.files) / 2**20
        return f"wrote {self.path} ({size:.1f} MiB), input images {self.input_shape}; onnxruntime vs torch: {diffs}"


def export_onnx(
    model: VisionTransformer,
    path: str | Path,
    *,
    img_size: int | tuple[int, int] | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
    verify_batches: tuple[int, ...] = (1, 3),
    atol: float = 1e-4,
) -> ExportReport:
    """Export `model` (fp32) to ONNX with a dynamic batch dimension and check it with onnxruntime.

    Args:
        model: A `VisionTransformer` (anything with `.cfg`), in fp32.
        path: Destination `.onnx` file.
        img_size: Input (H, W) baked into the graph; the model's own size by default.
        opset: ONNX opset version.
        overwrite: Replace an existing file.
        verify_batches: Batch sizes run through onnxruntime and compared with PyTorch; () skips the check.
        atol: Largest allowed absolute difference of the logits.

    Returns:
        An ExportReport with the written files and the measured differences.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        ValueError: Bad arguments (a non-.onnx suffix, a model not in fp32).
        RuntimeError: onnxruntime's logits differ from PyTorch's by more than `atol`.
    """
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"the output must be a .onnx file, got {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name such as {path / 'model.onnx'}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (or --force) to replace it")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ValueError(f"export needs an fp32 model, got parameters in {sorted(map(str, dtypes))}")
    cfg = model.cfg
    h, w = cfg.img_hw if img_size is None else to_hw(img_size)
    model = model.eval()
    device = next(model.parameters()).device
    example = torch.randn(2, cfg.in_chans, h, w, device=device)  # (B, C, H, W); B=2 so it is not specialised
    batch = torch.export.Dim("batch", min=1, max=4096)
    for module in ("onnx", "onnxscript", "onnxruntime")[: 3 if verify_batches else 2]:  # before writing anything
        require(module, "export", "ONNX export")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the exporter narrates each stage on stdout
            program = torch.onnx.export(
                model, (example,), input_names=["images"], output_names=["logits"],
                dynamic_shapes={"x": {0: batch}}, opset_version=opset, dynamo=True, verbose=False,
            )
            tmp = tmpdir / path.name
            if program is None:  # only the legacy (dynamo=False) exporter returns nothing
                raise RuntimeError("torch.onnx.export returned no program")
            program.save(str(tmp))  # weights over 2 GB go to an external-data file beside it
        diffs = _verify(tmp, model, (cfg.in_chans, h, w), verify_batches, atol) if verify_batches else {}
        files = sorted(tmpdir.iterdir(), key=lambda f: f.name == path.name)  # the .onnx itself last
        written = []
        for f in files:
            dest = path.parent / f.name
            if dest.exists() and not overwrite:
                raise FileExistsError(f"{dest} appeared while exporting; not replacing it")
            place(f, dest)  # fsync'ed, renamed, folder fsync'ed
            written.append(dest)
    except Exception as e:
        err = output_error(path, e)  # a full disk, whatever the exporter raised (while the partial file is there)
        if err is None or err is e:
            raise
        raise err from e
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return ExportReport(path, written, ("batch", cfg.in_chans, h, w), diffs)


def _verify(
    path: Path, model: nn.Module, chw: tuple[int, int, int], batches: tuple[int, ...], atol: float
) -> dict[int, float]:
    """Run onnxruntime and PyTorch on the same random images; raise if they differ by more than `atol`."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(0)
    diffs = {}
    for b in batches:
        x = torch.randn(b, *chw, generator=g)
        with torch.inference_mode():
            ref = model(x.to(next(model.parameters()).device)).float().cpu().numpy()
        out = session.run(["logits"], {"images": x.numpy()})[0]
        if out.shape != ref.shape:
            raise RuntimeError(f"onnxruntime returned shape {out.shape} for batch {b}, PyTorch {ref.shape}")
        diffs[b] = float(np.abs(out - ref).max())
        if diffs[b] > atol:
            raise RuntimeError(f"onnxruntime differs from PyTorch by {diffs[b]:.2e} (> {atol:g}) at batch {b}")
    return diffs
