import os

import pytest
import torch

# 2 cores: keep the suite deterministic and avoid oversubscription; under pytest-xdist (`make test` runs one
# worker per core) each worker takes its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))

# Measured choices (`precision: auto`, `mode="auto"`) take the rule-of-thumb default in tests: deterministic, no
# timing, no cache written; tests of vitlab.perf.autotune switch it on themselves.
os.environ.setdefault("VITLAB_AUTOTUNE", "off")

# VITLAB_FMNIST_DIR=/nonexistent hides the real dataset (to check what runs on a machine without it).
FMNIST_ROOT = os.environ.get("VITLAB_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def perturb_(module: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """Add noise to every float tensor so none stays trivially zero or one (heads, LayerNorms, biases)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g, dtype=t.dtype) * scale)
    return module


@pytest.fixture
def fmnist_root():
    if not os.path.isdir(FMNIST_ROOT):
        pytest.skip("dataset-fashion-mnist not installed")
    return FMNIST_ROOT


@pytest.fixture
def synthetic_data() -> dict:
    """The `data:` section for tests of the plumbing (training, resume, DDP, CLI), not of learning real images:
    vitlab's in-memory `synthetic` dataset, shaped like Fashion-MNIST, so these tests run on every machine."""
    return {"dataset": "synthetic"}


# Kernel emulation (`vitlab.perf.cpu.kernel_emulation`: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ... on an
# AVX-512 / AMX host, how the AVX2 host class is measured here) caps torch's and oneDNN's kernels while Inductor's
# code generation and OpenVINO's CPU plugin still read the real CPU's flags: the mixture is not a real host (Inductor
# bf16 / fp32 graphs have crashed or given wrong logits under it, OpenVINO refuses bf16 Softmax). Tests of those
# paths are skipped under emulation, with this reason; on a real AVX2 host they run.
EMULATED = bool(os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("ATEN_CPU_CAPABILITY"))
skip_if_emulated = pytest.mark.skipif(EMULATED, reason="kernel emulation: Inductor / OpenVINO read the real CPU's "
                                      "flags while torch's and oneDNN's kernels are capped (not a real host)")
