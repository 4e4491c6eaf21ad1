"""Export for deployment: an ONNX graph or an OpenVINO IR with a dynamic batch, fp32 or int8, each checked against
PyTorch before it is moved into place (`vitlab export` on the command line).

    report = export(vitlab.load_model("runs/finetune/model.safetensors"), "vit.onnx")  # verified, batch 1, 3
    report = export(model, "vit-int8.onnx", int8=True, calib=train_images, verify_images=test_images)
    options = ExportOptions(int8=True, calib=train_images, verify_images=test_images)
    report = export(model, "vit.xml", options=options)                # OpenVINO IR, from the suffix
    python -c "import onnxruntime as ort; ort.InferenceSession('vit.onnx').run(None, {'images': x})"

`export_onnx(model, path, **options)` and `export_openvino(...)` are `export` with the target fixed.

ONNX: `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), the exporter PyTorch maintains; the
input is named `images` (B, C, H, W) with B symbolic, the output `logits` (B, num_classes); int8 is ONNX Runtime's
static QDQ quantisation (`vitlab.deploy.runtimes.quantize_onnx`). OpenVINO: `openvino.convert_model` from the
PyTorch model, int8 by NNCF's post-training quantisation with its defaults, saved as IR (.xml + .bin, weights not
compressed). Real images for calibration and verification from files or data sets: `vitlab.cli.export`.

Verification: the written file is run by its runtime and compared with the PyTorch model: the largest logit
difference (fp32: at most `atol`, scaled by the largest logit when that is above 1) and, on `verify_images` (real
images), the top-1 agreement (int8: at least `min_agreement`). OpenVINO runs the IR at fp32 inference precision
for that check, and the IR records it (rt_info `runtime_options/INFERENCE_PRECISION_HINT`); plain OpenVINO
(`compile_model(path, "CPU")`, no config) defaults to bf16 on CPUs with native bf16 (logits ~1e-2 away) and its
2026.4 CPU plugin does not apply the recorded hint, so the check also runs the file that way and the report says
what it gives and, when that is off, the config to pass. Files are written into a temporary folder beside the
destination and moved into place only after that check (a Ctrl-C or SIGTERM meanwhile removes the folder), so a
failed or interrupted export never leaves a half-written or clobbered file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.config import to_hw
from ..models.vit import VisionTransformer
from ..utils.extras import require
from ..utils.io import holding_interrupts, output_error, place
from .calibration import calibration_batches
from .runtimes import (
    DEFAULT_OPSET,
    OV_PRECISIONS,
    _first_line,
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
OV_RUNTIME_PRECISION = "fp32"  # the inference precision an OpenVINO export is checked at and records
_OV_TYPES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}  # OpenVINO's element types -> ours


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
    # OpenVINO: the inference precision the file was checked at and records (rt_info runtime_options)
    runtime_precision: str | None = None
    # OpenVINO: what `compile_model(path, "CPU")` with no config gives here: its inference precision and its max
    # logit difference from the checked results (fp32: from PyTorch), and whether that is within the tolerance
    plain_precision: str | None = None
    plain_max_abs_diff: float | None = None
    plain_matches: bool | None = None

    def summary(self) -> str:
        diffs = ", ".join(f"batch {b}: {d:.2e}" for b, d in self.max_abs_diff.items()) or "not verified"
        size = sum(f.stat().st_size for f in self.files) / 2**20
        runtime = "onnxruntime" if self.target == "onnx" else "openvino"
        line = (f"wrote {self.path} ({size:.1f} MiB, {self.target} {self.precision}), input images "
                f"{self.input_shape}; {runtime} vs torch: {diffs}")
        if self.agreement is not None:
            line += (f"; on {self.verify_images} images of {self.verify_source}: top-1 agreement "
                     f"{100 * self.agreement:.2f}%, max logit diff {self.verify_max_abs_diff:.2e}")
        if self.runtime_precision is not None:
            line += (f"\nOpenVINO inference precision {self.runtime_precision}: checked at it, and recorded in the "
                     f"IR (rt_info runtime_options/INFERENCE_PRECISION_HINT = {OV_PRECISIONS[self.runtime_precision]})")
        if self.plain_precision is not None:
            against = "torch" if self.precision == "fp32" else "the checked run"
            line += (f"\nplain OpenVINO here (compile_model(path, \"CPU\"), no config) runs it at "
                     f"{self.plain_precision}: max logit diff {self.plain_max_abs_diff:.2e} from {against}")
            if not self.plain_matches:
                hint = OV_PRECISIONS[self.runtime_precision or OV_RUNTIME_PRECISION]
                line += (f", beyond the tolerance: this OpenVINO does not apply the precision the IR records; "
                         f"compile with {{\"INFERENCE_PRECISION_HINT\": \"{hint}\"}} for the checked results")
        return line


@dataclass(frozen=True)
class ExportOptions:
    """How `export` writes and checks a file; the same for both targets (each field is also a keyword of
    `export`, `export_onnx` and `export_openvino`).

    Attributes:
        img_size: Input (H, W) baked into the graph; the model's own size by default.
        opset: ONNX opset version (ONNX only).
        overwrite: Replace an existing file.
        verify_batches: Batch sizes of random images run through the runtime and compared with PyTorch; () skips
            that check.
        atol: Largest allowed absolute difference of fp32 logits (times the largest logit when that is above 1).
        int8: Quantise: ONNX Runtime's static QDQ quantisation, or NNCF's post-training quantisation (defaults),
            calibrated on `calib`.
        calib: Calibration images ((N, C, H, W) tensor or an iterable of batches), prepared as for the model.
        calib_images: At most this many calibration images.
        verify_images: Real images (N, C, H, W): top-1 agreement and max logit difference are measured on them.
        verify_source: Where `verify_images` came from (for the report).
        min_agreement: int8: the least top-1 agreement with PyTorch on `verify_images` that is accepted.
    """

    img_size: int | tuple[int, int] | None = None
    opset: int = DEFAULT_OPSET
    overwrite: bool = False
    verify_batches: tuple[int, ...] = (1, 3)
    atol: float = 1e-4
    int8: bool = False
    calib: Any = None
    calib_images: int = 300
    verify_images: torch.Tensor | None = None
    verify_source: str = "the given images"
    min_agreement: float = 0.95


def export(model: VisionTransformer, path: str | Path, to: str | None = None, options: ExportOptions | None = None,
           **fields: Any) -> ExportReport:
    """Export `model` (fp32) with a dynamic batch dimension and check the written file with its runtime.

    ONNX (`to="onnx"`, a .onnx file) is checked with onnxruntime; OpenVINO (`to="openvino"`, the IR's .xml, its .bin
    beside it) with OpenVINO's CPU plugin at fp32 inference precision, which the IR records as its
    INFERENCE_PRECISION_HINT; how plain OpenVINO (`compile_model` with no config) runs it is measured and reported.

    Args:
        model: A `VisionTransformer` (anything with `.cfg`), in fp32.
        path: Destination file.
        to: "onnx" or "openvino"; default from the suffix of `path` (.xml: openvino, else onnx).
        options: An `ExportOptions`; `fields` replace its fields (`export(m, p, int8=True, calib=images)`).

    Returns:
        An ExportReport with the written files and the measured differences.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        ValueError: Bad arguments (a suffix that is not the target's, a model not in fp32, bad calibration images).
        RuntimeError: The runtime's logits differ from PyTorch's by more than `atol` (fp32), or agree on fewer than
            `min_agreement` of `verify_images` (int8).
        MissingExtraError: The target's runtime is not installed.
    """
    path = Path(path)
    opts = replace(options or ExportOptions(), **fields)
    to = to or ("openvino" if path.suffix.lower() == SUFFIXES["openvino"] else "onnx")
    if to not in TARGETS:
        raise ValueError(f"unknown export target {to!r}; choose from {', '.join(TARGETS)}")
    cfg, (h, w) = _check_destination(model, path, to, opts.overwrite, opts.img_size)
    model = model.eval()
    shape = ("batch", cfg.in_chans, h, w)
    target = _onnx(model, path, shape, opts) if to == "onnx" else _openvino(model, path, shape, opts)
    return _export(model, path, target, opts)


def export_onnx(model: VisionTransformer, path: str | Path, **options: Any) -> ExportReport:
    """`export(model, path, to="onnx", **options)`: an ONNX graph checked with onnxruntime (see `ExportOptions`)."""
    return export(model, path, "onnx", **options)


def export_openvino(model: VisionTransformer, path: str | Path, **options: Any) -> ExportReport:
    """`export(model, path, to="openvino", **options)`: an OpenVINO IR (`path` .xml and the .bin beside it) checked
    with OpenVINO's CPU plugin at fp32 (see `ExportOptions`; `opset` is ONNX's)."""
    if "opset" in options:
        raise TypeError("export_openvino() got an unexpected keyword argument 'opset' (an ONNX option)")
    return export(model, path, "openvino", **options)


@dataclass
class _Target:
    """How one format is written into the staging folder and run back for the check."""

    name: str
    precision: str  # "fp32" | "int8"
    shape: tuple[str | int, ...]  # the input, batch symbolic
    write: Callable[[Path], Path]  # staging folder -> the main file written there
    runner: Callable[[Path], Callable[[np.ndarray], np.ndarray]]  # that file -> (B, C, H, W) -> logits
    notes: list[str] = field(default_factory=list)
    # that file compiled as a user of the runtime would (no config): (its inference precision, its runner)
    plain: Callable[[Path], tuple[str, Callable[[np.ndarray], np.ndarray]]] | None = None


def _onnx(model: nn.Module, path: Path, shape: tuple[str | int, ...], opts: ExportOptions) -> _Target:
    for module in ("onnx", "onnxscript", "onnxruntime"):  # before writing anything
        require(module, "export", "ONNX export")
    c, h, w = (int(s) for s in shape[1:])
    data, fmt = None, None
    if opts.int8:
        data = calibration_batches(opts.calib, (c, h, w), opts.calib_images)  # bad images: said before the work
        fmt = ort_int8_format()  # 7-bit weights on x86 without VNNI (saturation); in the report's notes

    def write(tmpdir: Path) -> Path:
        tmp = write_onnx(model, tmpdir / path.name, (h, w), opset=opts.opset)
        if opts.int8:
            fp32 = tmp.replace(tmpdir / "fp32.onnx.tmp")
            quantize_onnx(fp32, tmp, data, "static", fmt)
            fp32.unlink()
        return tmp

    def runner(tmp: Path) -> Callable[[np.ndarray], np.ndarray]:
        try:
            session = ort_session(tmp)
        except Exception as e:  # onnxruntime's own exception types; e.g. an opset newer than it reads
            ort = require("onnxruntime", "export", "ONNX export")
            raise ValueError(f"ONNX Runtime {ort.__version__} cannot load the opset-{opts.opset} graph written "
                             f"({_first_line(e)}); a lower opset (default {DEFAULT_OPSET}) may load") from e
        return lambda x: session.run(["logits"], {"images": x})[0]

    notes = [f"int8 format: {fmt}"] if fmt is not None else []
    return _Target("onnx", "int8" if opts.int8 else "fp32", shape, write, runner, notes)


def _openvino(model: nn.Module, path: Path, shape: tuple[str | int, ...], opts: ExportOptions) -> _Target:
    """The IR records the inference precision it is checked at (fp32) in its rt_info. Plain OpenVINO may not honour
    it (the CPU plugin of OpenVINO 2026.4 reads only its KV-cache and dynamic-quantisation options from there, and
    defaults to bf16 where the CPU has it natively), so `plain` compiles the file as a user would, for the check to
    measure what that gives."""
    ov = require("openvino", "openvino", "OpenVINO export")
    example = torch.randn(2, *(int(s) for s in shape[1:]))

    def write(tmpdir: Path) -> Path:
        ov_model = openvino_model(model, example, int8=opts.int8, calib=opts.calib, calib_images=opts.calib_images)
        tmp = tmpdir / path.name
        save_openvino(ov_model, tmp, precision=OV_RUNTIME_PRECISION)
        return tmp

    def runner(tmp: Path) -> Callable[[np.ndarray], np.ndarray]:
        compiled = compile_openvino(ov.Core().read_model(str(tmp)), precision=OV_RUNTIME_PRECISION)  # as written
        return lambda x: compiled(x)[0]

    def plain(tmp: Path) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
        compiled = ov.Core().compile_model(str(tmp), "CPU")  # as a user of plain OpenVINO would: no config
        precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32", "bf16"
        return _OV_TYPES.get(precision, precision), lambda x: compiled(x)[0]

    return _Target("openvino", "int8" if opts.int8 else "fp32", shape, write, runner, plain=plain)


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
        with holding_interrupts():  # a second signal does not leave half the folder behind
            shutil.rmtree(tmpdir, ignore_errors=True)


def _export(model: nn.Module, path: Path, target: _Target, opts: ExportOptions) -> ExportReport:
    """Write into a staging folder, verify what was written, move every file into place (the main one last)."""
    chw = tuple(int(s) for s in target.shape[1:])
    images = opts.verify_images
    if images is not None and (images.dim() != 4 or tuple(images.shape[1:]) != chw):
        raise ValueError(f"verification images have shape {tuple(images.shape)} but the model takes "
                         f"(N, {', '.join(map(str, chw))})")
    report = ExportReport(path, [], target.shape, {}, target.name, target.precision, notes=list(target.notes))
    if target.name == "openvino":
        report.runtime_precision = OV_RUNTIME_PRECISION
    with _staging(path) as tmpdir:
        tmp = target.write(tmpdir)
        if opts.verify_batches or images is not None:
            run = target.runner(tmp)
            atol = opts.atol if target.precision == "fp32" else None
            report.max_abs_diff = _verify_random(run, model, chw, opts.verify_batches, atol)
            if images is not None and len(images):
                _verify_real(run, model, images, report, opts.atol, opts.min_agreement)
                report.verify_source = opts.verify_source
            if target.plain is not None:
                _verify_plain(target.plain(tmp), run, model, chw, report, opts.atol)
        with holding_interrupts():  # all of the files or none: a signal waits until the last is in place
            for f in sorted(tmpdir.iterdir(), key=lambda f: f.name == path.name):  # the main file last
                dest = path.parent / f.name
                if dest.exists() and not opts.overwrite:
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


def _verify_plain(plain: tuple[str, Callable[[np.ndarray], np.ndarray]], run: Callable[[np.ndarray], np.ndarray],
                  model: nn.Module, chw: tuple[int, ...], report: ExportReport, atol: float) -> None:
    """What a user of the runtime gets from the file with no config (`plain`: its precision and runner), against
    PyTorch (fp32) or the checked run (int8), on three random images; into `report`, not raised: the file is right,
    and the summary says how to compile it for the checked results."""
    x = torch.randn(3, *chw, generator=torch.Generator().manual_seed(1))
    ref = _torch_logits(model, x) if report.precision == "fp32" else np.asarray(run(x.numpy()))
    report.plain_precision = plain[0]
    report.plain_max_abs_diff = float(np.abs(np.asarray(plain[1](x.numpy())) - ref).max())
    report.plain_matches = report.plain_max_abs_diff <= _tolerance(atol, ref)


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
