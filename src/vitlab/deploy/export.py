"""Export for deployment: an ONNX graph or an OpenVINO IR with a dynamic batch, fp32 or int8, each checked against
PyTorch before it is moved into place (`vitlab export` on the command line).

    report = export_onnx(vitlab.load_model("runs/finetune/model.safetensors"), "vit.onnx")  # verified, batch 1, 3
    report = export_onnx(model, "vit-int8.onnx", int8=True, calib=train_images, verify_images=test_images)
    report = export_openvino(model, "vit.xml", int8=True, calib=train_images, verify_images=test_images)
    python -c "import onnxruntime as ort; ort.InferenceSession('vit.onnx').run(None, {'images': x})"

ONNX: `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), the exporter PyTorch maintains; the
input is named `images` (B, C, H, W) with B symbolic, the output `logits` (B, num_classes); int8 is ONNX Runtime's
static QDQ quantisation (`vitlab.deploy.runtimes.quantize_onnx`). OpenVINO: `openvino.convert_model` from the
PyTorch model, int8 by NNCF's post-training quantisation with its defaults, saved as IR (.xml + .bin, weights not
compressed). Real images for calibration and verification from files or data sets: `vitlab.cli.export`.

Verification: the written file is run by its runtime and compared with the PyTorch model: the largest logit
difference (fp32: at most `atol`, scaled by the largest logit when that is above 1) and, on `verify_images` (real
images), the top-1 agreement (int8: at least `min_agreement`). Files are written into a temporary folder beside
the destination and moved into place only after that check, so a failed export never leaves a half-written or
clobbered file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.config import to_hw
from ..models.vit import VisionTransformer
from ..utils.extras import require
from ..utils.io import output_error, place
from .calibration import calibration_batches
from .runtimes import (
    DEFAULT_OPSET,
    compile_openvino,
    openvino_model,
    ort_int8_format,
    ort_session,
    quantize_onnx,
    save_openvino,
    write_onnx,
)

TARGETS = ("onnx", "openvino")
SUFFIXES = {"onnx": ".onnx", "openvino": ".xml"}


@dataclass
class ExportReport:
    """What an export wrote and how closely its runtime reproduces PyTorch."""

    path: Path
    files: list[Path]
    input_shape: tuple[str | int, ...]
    max_abs_diff: dict[int, float]  # batch size -> max |runtime - torch| over the logits (random images)
    target: str = "onnx"
    precision: str = "fp32"
    verify_source: str | None = None  # where the real verification images came from
    verify_images: int = 0
    agreement: float | None = None  # top-1 agreement with PyTorch on the verification images
    verify_max_abs_diff: float | None = None  # max |runtime - torch| on the verification images
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        diffs = ", ".join(f"batch {b}: {d:.2e}" for b, d in self.max_abs_diff.items()) or "not verified"
        size = sum(f.stat().st_size for f in self.files) / 2**20
        runtime = "onnxruntime" if self.target == "onnx" else "openvino"
        line = (f"wrote {self.path} ({size:.1f} MiB, {self.target} {self.precision}), input images "
                f"{self.input_shape}; {runtime} vs torch: {diffs}")
        if self.agreement is not None:
            line += (f"; on {self.verify_images} images of {self.verify_source}: top-1 agreement "
                     f"{100 * self.agreement:.2f}%, max logit diff {self.verify_max_abs_diff:.2e}")
        return line


def export_onnx(
    model: VisionTransformer,
    path: str | Path,
    *,
    img_size: int | tuple[int, int] | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
    verify_batches: tuple[int, ...] = (1, 3),
    atol: float = 1e-4,
    int8: bool = False,
    calib: Any = None,
    calib_images: int = 300,
    verify_images: torch.Tensor | None = None,
    verify_source: str = "the given images",
    min_agreement: float = 0.95,
) -> ExportReport:
    """Export `model` (fp32) to ONNX with a dynamic batch dimension and check it with onnxruntime.

    Args:
        model: A `VisionTransformer` (anything with `.cfg`), in fp32.
        path: Destination `.onnx` file.
        img_size: Input (H, W) baked into the graph; the model's own size by default.
        opset: ONNX opset version.
        overwrite: Replace an existing file.
        verify_batches: Batch sizes of random images run through onnxruntime and compared with PyTorch; ()
            skips that check.
        atol: Largest allowed absolute difference of fp32 logits (times the largest logit when that is above 1).
        int8: Quantise with ONNX Runtime's static QDQ quantisation calibrated on `calib`.
        calib: Calibration images ((N, C, H, W) tensor or an iterable of batches), prepared as for the model.
        calib_images: At most this many calibration images.
        verify_images: Real images (N, C, H, W): top-1 agreement and max logit difference are measured on them.
        verify_source: Where `verify_images` came from (for the report).
        min_agreement: int8: the least top-1 agreement with PyTorch on `verify_images` that is accepted.

    Returns:
        An ExportReport with the written files and the measured differences.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        ValueError: Bad arguments (a non-.onnx suffix, a model not in fp32, bad calibration images).
        RuntimeError: onnxruntime's logits differ from PyTorch's by more than `atol` (fp32), or agree on fewer
            than `min_agreement` of `verify_images` (int8).
    """
    path = Path(path)
    cfg, (h, w) = _check_destination(model, path, "onnx", overwrite, img_size)
    for module in ("onnx", "onnxscript", "onnxruntime"):  # before writing anything
        require(module, "export", "ONNX export")
    model = model.eval()
    data, fmt = None, None
    if int8:
        data = calibration_batches(calib, (cfg.in_chans, h, w), calib_images)  # bad images: said before the work
        fmt = ort_int8_format()  # 7-bit weights on x86 without VNNI (saturation); in the report's notes

    def write(tmpdir: Path) -> Path:
        tmp = write_onnx(model, tmpdir / path.name, (h, w), opset=opset)
        if int8:
            fp32 = tmp.replace(tmpdir / "fp32.onnx.tmp")
            quantize_onnx(fp32, tmp, data, "static", fmt)
            fp32.unlink()
        return tmp

    def runner(tmp: Path) -> Callable[[np.ndarray], np.ndarray]:
        session = ort_session(tmp)
        return lambda x: session.run(["logits"], {"images": x})[0]

    report = _export(model, path, "onnx", "int8" if int8 else "fp32", ("batch", cfg.in_chans, h, w), write, runner,
                     overwrite=overwrite, verify_batches=verify_batches, atol=atol, verify_images=verify_images,
                     verify_source=verify_source, min_agreement=min_agreement)
    if fmt is not None:
        report.notes.append(f"int8 format: {fmt}")
    return report


def export_openvino(
    model: VisionTransformer,
    path: str | Path,
    *,
    img_size: int | tuple[int, int] | None = None,
    overwrite: bool = False,
    verify_batches: tuple[int, ...] = (1, 3),
    atol: float = 1e-4,
    int8: bool = False,
    calib: Any = None,
    calib_images: int = 300,
    verify_images: torch.Tensor | None = None,
    verify_source: str = "the given images",
    min_agreement: float = 0.95,
) -> ExportReport:
    """Export `model` (fp32) to OpenVINO IR (`path` .xml and the .bin beside it) with a dynamic batch dimension and
    check it with OpenVINO's CPU plugin (fp32 inference precision). Arguments as `export_onnx`; `int8` quantises
    with NNCF (post-training, defaults) on `calib`.

    Raises:
        MissingExtraError: openvino / nncf is not installed (`pip install 'vitlab[openvino]'`).
        FileExistsError, ValueError, RuntimeError: as `export_onnx`.
    """
    path = Path(path)
    cfg, (h, w) = _check_destination(model, path, "openvino", overwrite, img_size)
    require("openvino", "openvino", "OpenVINO export")
    model = model.eval()
    example = torch.randn(2, cfg.in_chans, h, w)

    def write(tmpdir: Path) -> Path:
        ov_model = openvino_model(model, example, int8=int8, calib=calib, calib_images=calib_images)
        tmp = tmpdir / path.name
        save_openvino(ov_model, tmp)
        return tmp

    def runner(tmp: Path) -> Callable[[np.ndarray], np.ndarray]:
        ov = require("openvino", "openvino", "OpenVINO export")
        compiled = compile_openvino(ov.Core().read_model(str(tmp)), precision="fp32")  # what was written
        return lambda x: compiled(x)[0]

    return _export(model, path, "openvino", "int8" if int8 else "fp32", ("batch", cfg.in_chans, h, w), write,
                   runner, overwrite=overwrite, verify_batches=verify_batches, atol=atol, verify_images=verify_images,
                   verify_source=verify_source, min_agreement=min_agreement)


def _check_destination(model: nn.Module, path: Path, target: str, overwrite: bool,
                       img_size: int | tuple[int, int] | None) -> tuple[Any, tuple[int, int]]:
    """The model's config and the (H, W) to export at; raise for a bad destination or a model not in fp32."""
    suffix = SUFFIXES[target]
    if path.suffix != suffix:
        raise ValueError(f"the {target} output must be a {suffix} file, got {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name such as {path / ('model' + suffix)}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (or --force) to replace it")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ValueError(f"export needs an fp32 model, got parameters in {sorted(map(str, dtypes))}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("export runs on the CPU; move the model with .cpu()")
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "img_hw"):
        raise ValueError(f"export takes a vitlab model (with .cfg), got {type(model).__name__}")
    return cfg, (cfg.img_hw if img_size is None else to_hw(img_size))


@contextlib.contextmanager
def _staging(path: Path) -> Iterator[Path]:
    """A temporary folder beside `path`, removed afterwards; errors about the disk become OutputError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmpdir
    except Exception as e:
        err = output_error(path, e)  # a full disk, whatever the exporter raised (while the partial file is there)
        if err is None or err is e:
            raise
        raise err from e
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _export(model: nn.Module, path: Path, target: str, precision: str, shape: tuple[str | int, ...],
            write: Callable[[Path], Path], runner: Callable[[Path], Callable[[np.ndarray], np.ndarray]], *,
            overwrite: bool, verify_batches: tuple[int, ...], atol: float, verify_images: torch.Tensor | None,
            verify_source: str, min_agreement: float) -> ExportReport:
    """Write into a staging folder, verify what was written, move every file into place (the main one last)."""
    chw = tuple(int(s) for s in shape[1:])
    if verify_images is not None and (verify_images.dim() != 4 or tuple(verify_images.shape[1:]) != chw):
        raise ValueError(f"verification images have shape {tuple(verify_images.shape)} but the model takes "
                         f"(N, {', '.join(map(str, chw))})")
    report = ExportReport(path, [], shape, {}, target, precision)
    with _staging(path) as tmpdir:
        tmp = write(tmpdir)
        if verify_batches or verify_images is not None:
            run = runner(tmp)
            report.max_abs_diff = _verify_random(run, model, chw, verify_batches, atol if precision == "fp32" else None)
            if verify_images is not None and len(verify_images):
                _verify_real(run, model, verify_images, report, atol, min_agreement)
                report.verify_source = verify_source
        files = sorted(tmpdir.iterdir(), key=lambda f: f.name == path.name)  # the main file last
        for f in files:
            dest = path.parent / f.name
            if dest.exists() and not overwrite:
                raise FileExistsError(f"{dest} appeared while exporting; not replacing it")
            place(f, dest)  # fsync'ed, renamed, folder fsync'ed
            report.files.append(dest)
    return report


def _torch_logits(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model(x).float().numpy()


def _tolerance(atol: float, ref: np.ndarray) -> float:
    return atol * max(1.0, float(np.abs(ref).max()))


def _verify_random(run: Callable[[np.ndarray], np.ndarray], model: nn.Module, chw: tuple[int, ...],
                   batches: tuple[int, ...], atol: float | None) -> dict[int, float]:
    """Run the runtime and PyTorch on the same random images; raise if they differ by more than `atol` (None: no
    bound, for int8)."""
    g = torch.Generator().manual_seed(0)
    diffs = {}
    for b in batches:
        x = torch.randn(b, *chw, generator=g)
        ref = _torch_logits(model, x)
        out = np.asarray(run(x.numpy()))
        if out.shape != ref.shape:
            raise RuntimeError(f"the runtime returned shape {out.shape} for batch {b}, PyTorch {ref.shape}")
        diffs[b] = float(np.abs(out - ref).max())
        if atol is not None and diffs[b] > _tolerance(atol, ref):
            raise RuntimeError(f"the exported model differs from PyTorch by {diffs[b]:.2e} "
                               f"(> {_tolerance(atol, ref):g}) at batch {b}")
    return diffs


def _verify_real(run: Callable[[np.ndarray], np.ndarray], model: nn.Module, images: torch.Tensor,
                 report: ExportReport, atol: float, min_agreement: float, chunk: int = 32) -> None:
    """Top-1 agreement and max logit difference on real images, into `report`; raise when fp32 differs by more
    than `atol` or int8 agrees on fewer than `min_agreement` of them."""
    refs, outs = [], []
    for i in range(0, len(images), chunk):
        x = images[i : i + chunk].float()
        refs.append(_torch_logits(model, x))
        outs.append(np.asarray(run(np.ascontiguousarray(x.numpy()))))
    ref, out = np.concatenate(refs), np.concatenate(outs)
    report.verify_images = len(ref)
    report.agreement = float((ref.argmax(1) == out.argmax(1)).mean())
    report.verify_max_abs_diff = float(np.abs(out - ref).max())
    if report.precision == "fp32" and report.verify_max_abs_diff > _tolerance(atol, ref):
        raise RuntimeError(f"the exported model differs from PyTorch by {report.verify_max_abs_diff:.2e} "
                           f"(> {_tolerance(atol, ref):g}) on real images")
    if report.precision == "int8" and report.agreement < min_agreement:
        raise RuntimeError(f"the int8 model agrees with PyTorch on {100 * report.agreement:.1f}% of "
                           f"{len(ref)} images (< {100 * min_agreement:g}%); not written. More or better calibration "
                           f"images (--calib), or export fp32")
