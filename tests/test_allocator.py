"""glibc allocator settings (vitlab.perf.allocator): measured on this process's resident set, not on our word."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from vitlab.perf import allocator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator._libc_function("mallopt") is None,
                                reason="glibc only")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_release_freed_memory_returns_freed_heap_pages_to_the_kernel(monkeypatch):
    """128 MiB of 64 KiB blocks (below glibc's mmap threshold: served from the heap), all freed but the last (which
    pins the heap's top, so glibc's own trimming of the top cannot hand anything back): the pages stay resident
    until `release_freed_memory`, which gives back nearly all of them."""
    malloc, free = ctypes.CDLL(None).malloc, ctypes.CDLL(None).free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    blocks = [malloc(64 * 1024) for _ in range(2048)]
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)  # touched: resident
    for b in blocks[:-1]:
        free(b)
    before = _rss_mb()
    monkeypatch.setattr(allocator, "_keeping", False)  # as in an inference process (a training test may have run here)
    assert allocator.release_freed_memory()
    after = _rss_mb()
    free(blocks[-1])
    assert before - after > 96, f"resident {before:.0f} MiB before malloc_trim, {after:.0f} MiB after"


def test_mallopt_leaves_the_users_own_setting_alone(monkeypatch):
    """MALLOC_MMAP_THRESHOLD_ in the environment: the user chose; neither setting is applied."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert allocator._mallopt((allocator._M_TOP_PAD, 1 << 20)) is False


_FAULTS = textwrap.dedent("""
    import resource, sys, torch
    from vitlab.cli._common import apply_memory
    from vitlab.perf.allocator import release_freed_memory
    applied = apply_memory(sys.argv[1])
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(2 << 20)  # 8 MiB: above the bounded policy's mmap threshold, below glibc's ceiling
    del x
    release_freed_memory()  # what eval / predict do between batches
    before = faults()
    for _ in range(20):
        x = torch.ones(2 << 20)
        del x
        release_freed_memory()
    print(applied, faults() - before)
""")


@pytest.mark.parametrize("policy", ["bounded", "reuse"])
def test_memory_policy_as_the_kernel_counts_it(policy):
    """`--memory` of eval / predict, in a fresh process: 20 batches' worth of 8 MiB blocks, freed and released
    between them. bounded: each block is a new mapping, so the kernel faults in its 2,048 pages every time; reuse:
    the block is kept and reused, release_freed_memory leaves it alone: faults for a few blocks, not twenty."""
    out = subprocess.run([sys.executable, "-c", _FAULTS, policy], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    assert applied == "True"
    if policy == "bounded":
        assert int(faults) >= 20 * 2048 * 0.9, out.stdout
    else:
        # at most half the blocks' pages (measured: one to four blocks' worth, 2,048-8,192, the more when the machine
        # is busy; glibc maps a block apart when the heap cannot grow in place)
        assert int(faults) < 10 * 2048, out.stdout


def test_memory_policy_names_a_bad_choice():
    from vitlab.cli._common import apply_memory

    with pytest.raises(ValueError, match="--memory must be one of bounded, reuse"):
        apply_memory("fast")


@pytest.mark.parametrize("command", ["eval", "predict"])
@pytest.mark.parametrize("policy", [None, "reuse"])
def test_eval_and_predict_apply_their_memory_policy(command, policy, monkeypatch):
    """The commands set the allocator from --memory (default bounded) before any image is read."""
    import vitlab.cli.eval as cli_eval
    import vitlab.cli.predict as cli_predict
    import vitlab.inference.evaluate as evaluate
    import vitlab.inference.predict as predict
    from vitlab.cli import build_parser

    seen = []

    def stop(*args, **kwargs):
        raise RuntimeError("stop here")

    for mod in (cli_eval, cli_predict):
        monkeypatch.setattr(mod, "apply_memory", seen.append)
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", stop)
    monkeypatch.setattr(predict, "iter_predict", stop)
    argv = [command, "ckpt.safetensors", *(["--data", "fashion_mnist"] if command == "eval" else ["a.png"])]
    args = build_parser().parse_args(argv + ([] if policy is None else ["--memory", policy]))
    with pytest.raises(RuntimeError, match="stop here"):
        args._run(args)
    assert seen == [policy or "bounded"]
