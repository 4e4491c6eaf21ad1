"""`vitlab bench`: our ViT against timm, transformers, torchvision and onnxruntime, in one process.

    vitlab bench --model ViT-B/16 --batch-sizes 1 8 32 --dtypes fp32 bf16 --modes int8 compile
    vitlab bench --model ViT-Ti/16 --img-size 32 --depth 2 --rounds 2 -o /tmp/b   # a few seconds

Every peer is built with our shape and loaded with our weights (checked: its logits must match ours), then all
candidates run interleaved (ours, timm, transformers, ..., ours, timm, ...) after a warm-up, so a change in the
machine's load hits them alike. For each we report the median and min/max over the rounds, the paired ratio of
our time to each peer's (median over rounds), and the achieved FLOP/s (`vitlab.models.flops.count_flops`, attention
included) as a fraction of this machine's measured matmul peak in the same dtype (MFU). Peak memory is the
rise of the process's resident set during one call, sampled every millisecond (CPU; on CUDA,
`torch.cuda.max_memory_allocated`). Results go to the terminal, `bench.json` and `bench.png`.

One module per job:
- `timing`: `time_calls`, `peak_memory`, `matmul_peak`, `machine_info` (also what `benchmarks/` measure with);
- `peers`: the peer builders (`build_timm`, ..., `OnnxRuntime`, `build_runtime` for ONNX Runtime / OpenVINO);
- `suite`: `BenchConfig`, `run_bench`, `Result`, and `mode_accuracy` (accuracy cost of the speed modes);
- `output`: `format_table`, `plot_results`, `write_outputs`.
The command line (`vitlab.cli.bench`) only parses arguments and calls `run_bench` and `write_outputs`.
"""

from .output import format_table, plot_results, write_outputs
from .peers import (
    BUILDERS,
    PEERS,
    RUNTIME_PEERS,
    OnnxRuntime,
    build_runtime,
    build_timm,
    build_torchvision,
    build_transformers,
)
from .suite import DTYPES, BenchConfig, Result, mode_accuracy, run_bench
from .timing import machine_info, matmul_peak, peak_memory, perturb_, time_calls

__all__ = [
    "BUILDERS",
    "DTYPES",
    "PEERS",
    "RUNTIME_PEERS",
    "BenchConfig",
    "OnnxRuntime",
    "Result",
    "build_runtime",
    "build_timm",
    "build_torchvision",
    "build_transformers",
    "format_table",
    "machine_info",
    "matmul_peak",
    "mode_accuracy",
    "peak_memory",
    "perturb_",
    "plot_results",
    "run_bench",
    "time_calls",
    "write_outputs",
]
