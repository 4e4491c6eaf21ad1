"""Deployment: a trained model made faster for inference, or written for another runtime.

    fast = vitlab.optimize(model, "int8")                       # optimize.py: the front door, every speed mode
    fast = vitlab.optimize(model, "auto", calib=images)         # autoselect.py: the fastest that keeps top-1
    fast = to_openvino(model, example, int8=True, calib=images)  # runtimes.py: OpenVINO / ONNX Runtime
    report = export(model, "vit.onnx")                          # export.py: files, verified against PyTorch

Inside, each module imports only those below it (import-linter checks it, pyproject.toml):

    optimize      `vitlab.optimize(model, mode)`: checks the mode, "auto" to autoselect, the rest to modes
    autoselect    mode "auto": candidates pruned by CPU features, timed within a budget, cached per machine
    modes         builds one concrete mode (eager dtypes, compile, dynamic int8, static int8, the runtimes)
    export        ONNX / OpenVINO files, verified against PyTorch before they are moved into place
    quant         static int8 (PT2E + Inductor)
    runtimes      OpenVINO and ONNX Runtime behind the fp32-in, fp32-out contract; the ONNX writer
    calibration   the one reader of calibration images
    optimized     `OptimizedModel`, what every mode returns

The names below are the runtimes' (what `vitlab.deploy` held when it was one module).
"""

from .calibration import DEFAULT_CALIB_IMAGES, calibration_batches, calibration_tensor, input_chw
from .optimized import OptimizedModel
from .runtimes import (
    ORT_INT8_METHODS,
    OV_PRECISIONS,
    VNNI_FLAGS,
    OrtInt8Format,
    RuntimeModule,
    compile_openvino,
    onnx_file,
    openvino_model,
    ort_int8_format,
    ort_session,
    quantize_onnx,
    require_nncf,
    save_openvino,
    to_onnxruntime,
    to_openvino,
    write_onnx,
)

__all__ = [
    "DEFAULT_CALIB_IMAGES",
    "ORT_INT8_METHODS",
    "OV_PRECISIONS",
    "VNNI_FLAGS",
    "OptimizedModel",
    "OrtInt8Format",
    "RuntimeModule",
    "calibration_batches",
    "calibration_tensor",
    "compile_openvino",
    "input_chw",
    "onnx_file",
    "openvino_model",
    "ort_int8_format",
    "ort_session",
    "quantize_onnx",
    "require_nncf",
    "save_openvino",
    "to_onnxruntime",
    "to_openvino",
    "write_onnx",
]
