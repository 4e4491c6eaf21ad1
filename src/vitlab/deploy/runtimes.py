"""Deployment runtimes: our model run by OpenVINO or ONNX Runtime, behind the fp32-in, fp32-out contract of
`vitlab.optimize`.

    fast = to_openvino(model, example)                              # OpenVINO CPU plugin, fp32
    fast = to_openvino(model, example, precision="bf16")            # bf16 where the CPU has it (AVX512-BF16, AMX)
    fast = to_openvino(model, example, int8=True, calib=images)     # NNCF post-training quantisation, defaults
    fast = to_onnxruntime(model, example, int8=True, calib=images)  # ORT static QDQ int8 (U8 activations, S8 weights)
    print(fast.module)                                              # ... with the int8 format chosen for this CPU
    logits = fast(images)                                           # (B, num_classes) fp32 torch tensor

Each returns an `OptimizedModel` (`vitlab.deploy.optimized`) whose `.module` is a `RuntimeModule` holding the compiled
graph: it takes fp32 (or any float) images (B, C, H, W) on the CPU, with B free, and returns fp32 logits.
`save_openvino` / `write_onnx` write what these build (`vitlab.deploy.export` uses them).

int8 needs calibration images: real images prepared the way the model expects ((N, C, H, W) tensor, or an
iterable of such batches or of (images, labels) pairs, e.g. `vitlab.data.build_eval_data(...)`); NNCF's default
takes 300 of them. OpenVINO's graph comes from the PyTorch model directly (`openvino.convert_model`, which keeps
`scaled_dot_product_attention` as one op); ONNX Runtime's from `write_onnx` (torch.onnx, dynamo).

ONNX Runtime's static int8 format depends on the CPU (`ort_int8_format`): on x86 without VNNI its U8S8 kernels add
pairs of u8 x s8 products in int16, which 8-bit weights can saturate, so the weights take 7 bits there
(`reduce_range`, as onnxruntime.quantization's guide for such CPUs says); the choice and its reason are logged
(logger "vitlab.deploy") and shown by the module.
"""

from __future__ import annotations

import contextlib
import io
import logging
import platform
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.vit import VisionTransformer
from ..perf.cpu import cpu_flags
from ..utils.extras import require
from .calibration import DEFAULT_CALIB_IMAGES, calibration_batches
from .optimized import OptimizedModel

OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}  # ours -> OpenVINO's INFERENCE_PRECISION_HINT
ORT_INT8_METHODS = ("static", "dynamic")
# the ONNX opset `write_onnx` targets. From 20 the exporter writes GELU as ONNX's one `Gelu` op; at 18 it wrote
# Div, Erf, Add, Mul, Mul, a form ONNX Runtime 1.32 does not fuse: its int8 graph of ViT-B/16 ran 1.07x faster at
# batch 8 from 20 (2026-12-07, Zen 4, docs/speed.md), as fast as the TorchScript exporter's graph
DEFAULT_OPSET = 20
# x86 flags of an int8 dot product that accumulates in int32 (VPDPBUSD of AVX512-VNNI or AVX-VNNI; AMX-INT8 tiles)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")

log = logging.getLogger("vitlab.deploy")


class RuntimeModule(nn.Module):
    """A compiled runtime graph as a module: (B, C, H, W) float images -> (B, num_classes) fp32 logits.

    Attributes:
        runtime: "openvino" or "onnxruntime".
        precision: "fp32", "bf16" or "int8" (what the runtime computes in).
        chw: The (C, H, W) the graph was built for.
        int8_format: ONNX Runtime int8: the format it was quantised in, and why (`ort_int8_format`); else None.
    """

    def __init__(self, run: Callable[[np.ndarray], np.ndarray], runtime: str, precision: str,
                 chw: tuple[int, int, int], keep: Any = None, int8_format: OrtInt8Format | None = None):
        super().__init__()
        self._run = run
        self._keep = keep  # what the runtime needs alive (its compiled model or session)
        self.runtime, self.precision, self.chw = runtime, precision, chw
        self.int8_format = int8_format

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.chw:
            raise ValueError(f"{self.runtime} model takes images (B, {', '.join(map(str, self.chw))}), got "
                             f"{tuple(x.shape)}")
        a = np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())  # (B, C, H, W) fp32
        return torch.from_numpy(np.asarray(self._run(a), dtype=np.float32)).to(x.device)  # (B, num_classes)

    def extra_repr(self) -> str:
        fmt = f", int8_format='{self.int8_format}'" if self.int8_format is not None else ""
        return f"runtime={self.runtime!r}, precision={self.precision!r}, chw={self.chw}{fmt}"


# -- inputs ------------------------------------------------------------------------------------------------


def _chw(model: nn.Module, example: torch.Tensor) -> tuple[int, int, int]:
    """(C, H, W) of `example`, checked against the model's config and that the model is an fp32 CPU model."""
    params = list(model.parameters())
    dtypes = {p.dtype for p in params}
    if dtypes != {torch.float32}:
        raise ValueError(f"deploying needs an fp32 model, got parameters in {sorted(map(str, dtypes))}")
    if any(p.device.type != "cpu" for p in params):
        raise ValueError("OpenVINO and ONNX Runtime deployment run on the CPU; move the model with .cpu()")
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        raise ValueError(f"example must be a (B, C, H, W) image tensor, got "
                         f"{tuple(example.shape) if isinstance(example, torch.Tensor) else type(example).__name__}")
    chw = (int(example.shape[1]), int(example.shape[2]), int(example.shape[3]))
    cfg = getattr(model, "cfg", None)
    if cfg is not None and chw[0] != cfg.in_chans:
        raise ValueError(f"example has {chw[0]} channel(s) but the model takes in_chans={cfg.in_chans}")
    return chw


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the converters' narration during a build: stdout and progress bars, tracer warnings, and log
    records below ERROR (onnxruntime.quantization logs advice through the root logger; importing nncf makes
    torch log that there is no CUDA)."""
    before = logging.root.manager.disable
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)
        # the quantisers reconfigure the root logger (level ERROR after an ONNX Runtime / NNCF build): undo it, so
        # the caller's warnings still reach the caller's handlers
        logging.root.setLevel(root_level)
        logging.root.handlers[:] = root_handlers


# -- OpenVINO ----------------------------------------------------------------------------------------------


def require_nncf() -> Any:
    """nncf, imported quietly; MissingExtraError naming `vitlab[openvino]` when it is not installed."""
    with _quiet():
        return require("nncf", "openvino", "OpenVINO int8 (NNCF)")


def openvino_model(model: nn.Module, example: torch.Tensor, *, int8: bool = False, calib: Any = None,
                   calib_images: int = DEFAULT_CALIB_IMAGES) -> Any:
    """The OpenVINO graph (`openvino.Model`) of `model`, batch dimension dynamic; with `int8`, quantised by NNCF's
    post-training quantisation calibrated on `calib`, with `model_type=TRANSFORMER` for a VisionTransformer (NNCF's
    setting for transformers: it keeps the sensitive ops out of int8; on Zen 4 it gave 99.4 % top-1 agreement with fp32
    against 98.9 % with NNCF's defaults, at the same speed: benchmarks/results/int8-zen4-accuracy).

    Raises:
        MissingExtraError: openvino (or nncf for int8) is not installed.
        ValueError: A model that is not fp32 on the CPU, bad calibration images, or a model OpenVINO cannot convert.
    """
    ov = require("openvino", "openvino", "OpenVINO deployment")
    nncf = require_nncf() if int8 else None
    chw = _chw(model, example)
    data = calibration_batches(calib, chw, calib_images) if int8 else None
    model = model.eval()
    try:
        with _quiet(), torch.no_grad():
            ov_model = ov.convert_model(model, example_input=example, input=[(-1, *chw)])
    except Exception as e:
        raise ValueError(f"OpenVINO cannot convert this model: {_first_line(e)}") from e
    if nncf is not None and data is not None:
        with _quiet():
            kind = {"model_type": nncf.ModelType.TRANSFORMER} if isinstance(model, VisionTransformer) else {}
            ov_model = nncf.quantize(ov_model, nncf.Dataset(data), subset_size=len(data), **kind)
    return ov_model


def to_openvino(model: nn.Module, example: torch.Tensor, *, int8: bool = False, calib: Any = None,
                precision: str = "fp32", threads: int | None = None, calib_images: int = DEFAULT_CALIB_IMAGES
                ) -> OptimizedModel:
    """`model` compiled by OpenVINO's CPU plugin, as a module with vitlab.optimize's fp32-in, fp32-out contract.

    Args:
        model: An fp32 classifier on the CPU (a VisionTransformer or anything taking (B, C, H, W) images).
        example: Images of the input shape (B, C, H, W); B is left dynamic.
        int8: Quantise with NNCF (post-training, defaults) on `calib`.
        calib: Calibration images (see `calibration_batches`); needed with `int8`.
        precision: "fp32" or "bf16": the CPU plugin's inference precision for what is not int8.
        threads: Inference threads (default: torch's).
        calib_images: At most this many calibration images.

    Raises:
        MissingExtraError: openvino / nncf is not installed (`pip install 'vitlab[openvino]'`).
        ValueError: An unknown precision, bf16 on a CPU without it, bad inputs, a model OpenVINO cannot convert.
    """
    if precision not in OV_PRECISIONS:
        raise ValueError(f"unknown OpenVINO precision {precision!r}; choose from {', '.join(OV_PRECISIONS)}")
    ov_model = openvino_model(model, example, int8=int8, calib=calib, calib_images=calib_images)
    compiled = compile_openvino(ov_model, precision=precision, threads=threads)
    chw = _chw(model, example)
    name = "int8" if int8 else precision
    run = _ov_runner(compiled)
    mode = "openvino" + ("-int8" if int8 else "-bf16" if precision == "bf16" else "")
    return OptimizedModel(RuntimeModule(run, "openvino", name, chw, keep=compiled), mode, torch.float32)


def compile_openvino(ov_model: Any, *, precision: str = "fp32", threads: int | None = None) -> Any:
    """`ov_model` compiled for the CPU in `precision` ("fp32" pinned: OpenVINO picks bf16 itself on AMX CPUs)."""
    ov = require("openvino", "openvino", "OpenVINO deployment")
    core = ov.Core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise ValueError("OpenVINO bf16 needs a CPU with bf16 support (AVX512-BF16 or AMX); this one has none")
    config = {"INFERENCE_PRECISION_HINT": OV_PRECISIONS[precision],
              "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads())}
    return core.compile_model(ov_model, "CPU", config)


def _ov_runner(compiled: Any) -> Callable[[np.ndarray], np.ndarray]:
    request = compiled.create_infer_request()
    out = compiled.output(0)

    def run(x: np.ndarray) -> np.ndarray:
        return request.infer({0: x})[out].copy()  # the request reuses its output buffer: copy before the next call

    return run


def save_openvino(ov_model: Any, path: str | Path, *, precision: str | None = None) -> None:
    """Write `ov_model` as IR (`path` .xml + .bin beside it), weights as they are (no fp16 compression).

    With `precision` ("fp32", "bf16") the IR records it as its runtime option INFERENCE_PRECISION_HINT (rt_info
    `runtime_options`), for the tools that read it; OpenVINO 2026.4's CPU plugin does not apply it (it reads only the
    KV-cache and dynamic-quantisation options there), so a user still passes it to `compile_model`."""
    ov = require("openvino", "openvino", "OpenVINO export")
    if precision is not None:
        ov_model.set_rt_info(OV_PRECISIONS[precision], ["runtime_options", "INFERENCE_PRECISION_HINT"])
    ov.save_model(ov_model, str(path), compress_to_fp16=False)


# -- ONNX Runtime ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrtInt8Format:
    """How `quantize_onnx` quantises for ONNX Runtime, and why (`ort_int8_format` chooses it for a CPU).

    Attributes:
        activations, weights: onnxruntime.quantization.QuantType names ("QUInt8", "QInt8").
        reduce_range: Weights in 7 bits (|w| <= 64) instead of 8.
        reason: Why this format on this CPU.
    """

    activations: str
    weights: str
    reduce_range: bool
    reason: str

    def __str__(self) -> str:
        bits = "7 bits (reduce_range)" if self.reduce_range else "8 bits"
        names = {"QUInt8": "U8", "QInt8": "S8"}
        return (f"{names.get(self.activations, self.activations)} activations, {names.get(self.weights, self.weights)}"
                f" weights in {bits}: {self.reason}")


def ort_int8_format(flags: Collection[str] | None = None, machine: str | None = None) -> OrtInt8Format:
    """The int8 format for ONNX Runtime on a CPU with these /proc/cpuinfo `flags` and this `platform.machine()`
    (default: this CPU's, `vitlab.perf.cpu.cpu_flags`).

    U8 activations and S8 weights everywhere (onnxruntime.quantization's guide for x86 CPUs; the ARM kernels take
    them too). On x86 without VNNI, ONNX Runtime's U8S8 kernels multiply with VPMADDUBSW, which adds two u8 x s8
    products into an int16 and saturates: 2 x 255 x 127 = 64770 does not fit in 32767. The guide says to quantise
    the weights to 7 bits there (`reduce_range`): 2 x 255 x 64 = 32640 fits. With VNNI (VPDPBUSD accumulates in
    int32) or AMX-INT8 nothing saturates and the weights keep their 8 bits. An x86 CPU whose flags cannot be read
    (no /proc/cpuinfo) is taken to have no VNNI: 7 bits cost little accuracy, saturation can cost much.
    """
    arch = (machine if machine is not None else platform.machine()).lower()
    if arch not in _X86:
        return OrtInt8Format("QUInt8", "QInt8", False, f"{arch or 'this CPU'} is not x86: no int16 saturation")
    flags = cpu_flags() if flags is None else flags
    have = [f for f in VNNI_FLAGS if f in flags]
    if have:
        return OrtInt8Format("QUInt8", "QInt8", False, f"the CPU has {', '.join(have)}: int8 products add up "
                                                        "in int32, nothing saturates")
    return OrtInt8Format("QUInt8", "QInt8", True, f"the CPU has no VNNI ({', '.join(VNNI_FLAGS)}): ONNX Runtime's "
                                                  "U8S8 kernels add u8 x s8 pairs in int16, which 8-bit weights can "
                                                  "saturate")


def write_onnx(model: nn.Module, path: str | Path, img_hw: tuple[int, int], *, opset: int = DEFAULT_OPSET) -> Path:
    """`model` (an fp32 vitlab model on the CPU, with `.cfg`) as an ONNX file at `path`: input `images` (B, C, H, W)
    with B symbolic, output `logits` (B, num_classes), through `torch.onnx.export(..., dynamo=True)` (torch.export +
    onnxscript), at `opset` (default `DEFAULT_OPSET`: ONNX Runtime >= 1.16 reads it). Weights over 2 GB go to an
    external-data file beside it.

    Raises:
        ValueError: `opset` is not a positive integer, or the exporter cannot write this model at that opset (where
            its version converter cannot reach it, torch.onnx keeps the graph at 18: refused, nothing written)."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 1:
        raise ValueError(f"ONNX opset must be a positive integer; got {opset!r}")
    cfg: Any = model.cfg
    example = torch.randn(2, cfg.in_chans, *img_hw)  # (B, C, H, W); B=2 so it is not specialised
    batch = torch.export.Dim("batch", min=1, max=4096)
    # the exporter narrates each stage on stdout, and where it cannot reach `opset` logs a traceback and keeps its
    # graph at 18 (refused below, by name)
    with contextlib.ExitStack() as stack:
        for lg in map(logging.getLogger, ("onnxscript", "torch.onnx")):
            stack.callback(lg.setLevel, lg.level)
            lg.setLevel(logging.CRITICAL + 1)
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        program = torch.onnx.export(
            model.eval(), (example,), input_names=["images"], output_names=["logits"],
            dynamic_shapes={"x": {0: batch}}, opset_version=opset, dynamo=True, verbose=False,
        )
        if program is None:  # only the legacy (dynamo=False) exporter returns nothing
            raise RuntimeError("torch.onnx.export returned no program")
        written = program.model.opset_imports.get("")
        if written != opset:
            hint = "a later" if written is not None and written > opset else "an earlier"
            raise ValueError(f"torch.onnx cannot write this model at ONNX opset {opset} (its graph came out at opset "
                             f"{written}); choose {hint} one (default {DEFAULT_OPSET})")
        program.save(str(path))
    return Path(path)


def onnx_file(model: nn.Module, example: torch.Tensor, folder: Path, *, int8: bool = False, calib: Any = None,
              method: str = "static", calib_images: int = DEFAULT_CALIB_IMAGES,
              int8_format: OrtInt8Format | None = None) -> Path:
    """Write `model` as ONNX into `folder` (fp32, `write_onnx`) and, with `int8`, quantise it with
    onnxruntime.quantization: "static" = QDQ, U8 activations calibrated (min-max) on `calib`, S8 weights per
    output channel; "dynamic" = S8 weights, activations quantised per call; the weights in 7 bits where
    `int8_format` (default: `ort_int8_format()` of this CPU) says so. Returns the path of the file to run."""
    if method not in ORT_INT8_METHODS:
        raise ValueError(f"unknown ONNX Runtime int8 method {method!r}; choose from {', '.join(ORT_INT8_METHODS)}")
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module, "export", "ONNX Runtime deployment")
    chw = _chw(model, example)
    if getattr(model, "cfg", None) is None:
        raise ValueError("ONNX export takes a vitlab model (with .cfg)")
    data = calibration_batches(calib, chw, calib_images) if int8 and method == "static" else None
    Path(folder).mkdir(parents=True, exist_ok=True)
    fp32 = write_onnx(model, Path(folder) / "model.onnx", chw[1:])
    if not int8:
        return fp32
    return quantize_onnx(fp32, Path(folder) / "model.int8.onnx", data, method, int8_format)


def quantize_onnx(src: Path, dest: Path, calib: list[np.ndarray] | None, method: str = "static",
                  int8_format: OrtInt8Format | None = None) -> Path:
    """onnxruntime.quantization of the fp32 graph `src` into `dest`: "static" = QDQ, U8 activations calibrated
    (min-max) on `calib` ((1, C, H, W) arrays), S8 weights per output channel; "dynamic" = S8 weights per output
    channel, activations quantised per call. The weights take 7 bits where `int8_format` (default:
    `ort_int8_format()`, this CPU's) says so; the format and its reason are logged at INFO."""
    from onnxruntime import quantization as q

    fmt = int8_format or ort_int8_format()
    log.info("ONNX Runtime int8 (%s): %s", method, fmt)
    with _quiet():
        if method == "dynamic":
            q.quantize_dynamic(src, dest, per_channel=True, weight_type=getattr(q.QuantType, fmt.weights),
                               reduce_range=fmt.reduce_range)
        else:
            # memory: the calibration graph reduces each tensor to its min and max inside the graph
            q.quantize_static(src, dest, _Reader(calib or []), quant_format=q.QuantFormat.QDQ, per_channel=True,
                              activation_type=getattr(q.QuantType, fmt.activations),
                              weight_type=getattr(q.QuantType, fmt.weights), reduce_range=fmt.reduce_range)
    return dest


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over a list of (1, C, H, W) arrays."""

    def __init__(self, data: list[np.ndarray]):
        self._it = iter(data)

    def get_next(self) -> dict[str, np.ndarray] | None:
        x = next(self._it, None)
        return None if x is None else {"images": x}


def ort_session(path: str | Path, threads: int | None = None) -> Any:
    """An onnxruntime CPU session of `path` with all graph optimisations and `threads` intra-op threads."""
    ort = require("onnxruntime", "export", "ONNX Runtime deployment")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads or torch.get_num_threads())
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def to_onnxruntime(model: nn.Module, example: torch.Tensor, *, int8: bool = False, calib: Any = None,
                   method: str = "static", threads: int | None = None, calib_images: int = DEFAULT_CALIB_IMAGES,
                   int8_format: OrtInt8Format | None = None) -> OptimizedModel:
    """`model` exported to ONNX and run by ONNX Runtime's CPU provider, behind `vitlab.optimize`'s contract.

    Args:
        model: An fp32 VisionTransformer on the CPU.
        example: Images of the input shape (B, C, H, W); B is left dynamic.
        int8: Quantise (onnxruntime.quantization, `method` "static" with `calib`, or "dynamic").
        calib: Calibration images (see `calibration_batches`); needed for static int8.
        threads: Intra-op threads (default: torch's).
        int8_format: The int8 format (default: `ort_int8_format()`, chosen for this CPU); the returned module's
            `.module.int8_format` says which was used and why.

    Raises:
        MissingExtraError: onnx / onnxruntime / onnxscript is not installed (`pip install 'vitlab[export]'`).
        ValueError: Bad inputs or a model the exporter cannot express.
    """
    chw = _chw(model, example)
    fmt = (int8_format or ort_int8_format()) if int8 else None
    with tempfile.TemporaryDirectory(prefix="vitlab-ort-") as tmp:
        try:
            path = onnx_file(model, example, Path(tmp), int8=int8, calib=calib, method=method,
                             calib_images=calib_images, int8_format=fmt)
        except (ValueError, ImportError):
            raise
        except Exception as e:
            raise ValueError(f"ONNX export cannot express this model: {_first_line(e)}") from e
        session = ort_session(path, threads)  # the graph is in memory now; the files may go
    name = session.get_outputs()[0].name

    def run(x: np.ndarray) -> np.ndarray:
        return session.run([name], {"images": x})[0]

    mode = "ort-int8" if int8 else "ort"
    return OptimizedModel(RuntimeModule(run, "onnxruntime", "int8" if int8 else "fp32", chw, keep=session,
                                        int8_format=fmt), mode, torch.float32)
