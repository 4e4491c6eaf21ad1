"""`vitlab bench`: our ViT against timm, transformers, torchvision and onnxruntime, in one process.

    vitlab bench --model ViT-B/16 --batch-sizes 1 8 32 --dtypes fp32 bf16 --modes int8 compile
    vitlab bench --model ViT-Ti/16 --img-size 32 --depth 2 --rounds 2 --out /tmp/b   # a few seconds

Every peer is built with our shape and loaded with our weights (checked: its logits must match ours), then all
candidates run interleaved (ours, timm, transformers, ..., ours, timm, ...) after a warm-up, so a change in the
machine's load hits them alike. For each we report the median and min/max over the rounds, the paired ratio of
our time to each peer's (median over rounds), and the achieved FLOP/s (`vitlab.flops.count_flops`, attention
included) as a fraction of this machine's measured matmul peak in the same dtype (MFU). Peak memory is the
rise of the process's resident set during one call, sampled every millisecond (CPU; on CUDA,
`torch.cuda.max_memory_allocated`). Results go to the terminal, `bench.json` and `bench.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig
from .flops import count_flops
from .model import VisionTransformer, create_model
from .optimize import MODES, optimize

PEERS = ("timm", "transformers", "torchvision", "onnxruntime")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# -- the machine ------------------------------------------------------------------------------------------


def machine_info() -> dict:
    """CPU model, cores, threads, library versions and the current load: what a result is only valid for."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    for lib in ("timm", "transformers", "torchvision", "onnxruntime"):
        with contextlib.suppress(ImportError):
            info[lib] = __import__(lib).__version__
    return info


def matmul_peak(dtype: torch.dtype, device: str = "cpu", n: int = 2048, rounds: int = 5) -> float:
    """The best FLOP/s of an n x n x n matmul in `dtype`, over the two layouts a model uses: `a @ b` and a Linear
    layer's `a @ w.T` with w stored (out, in), whose oneDNN kernels differ by up to 3x in bf16 on some CPUs
    (int8: int8 x int8 -> int32 via torch._int_mm)."""
    if dtype == torch.int8:
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        fns = [lambda: torch._int_mm(a, b)]
    else:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        fns = [lambda: a @ b, lambda: F.linear(a, b)]
    best = min(min(_time_calls(fn, warmup=2, rounds=rounds, iters=2, device=device)) for fn in fns)
    return 2 * n**3 / best


# -- timing and memory ------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_calls(fn: Callable[[], object], warmup: int, rounds: int, iters: int, device: str) -> list[float]:
    """Seconds per call, one entry per round of `iters` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        out.append((time.perf_counter() - t) / iters)
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory(fn: Callable[[], object], device: str = "cpu") -> int | None:
    """Bytes the call `fn()` needs above what is already held: CUDA's allocator peak, or on CPU the largest rise
    of the resident set (sampled every millisecond, freed heap returned to the OS first)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    if not os.path.exists("/proc/self/statm"):
        return None
    _malloc_trim()
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    peak[0] = max(peak[0], _rss())
    return peak[0] - base


# -- the candidates: ours and the peers, same shape, same weights -----------------------------------------


class _Logits(nn.Module):
    """transformers returns an output object; this returns its logits tensor like the others."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def build_timm(model: VisionTransformer) -> nn.Module:
    """timm's VisionTransformer with our shape and weights (same parameter names: loaded as is)."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    c = model.cfg
    peer = TimmViT(
        img_size=c.img_hw, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
        global_pool="token" if c.pool == "token" else "avg", embed_dim=c.embed_dim, depth=c.depth,
        num_heads=c.num_heads, mlp_ratio=c.mlp_dim / c.embed_dim, qkv_bias=c.qkv_bias, class_token=c.class_token,
        no_embed_class=False, pos_embed="learn" if c.pos_embed == "learned" else "none",
        norm_layer=functools.partial(nn.LayerNorm, eps=c.layer_norm_eps),
    )
    peer.load_state_dict(model.state_dict(), strict=True)
    return peer


def build_torchvision(model: VisionTransformer) -> nn.Module:
    """torchvision's VisionTransformer (square images, class token, learned position embeddings only)."""
    from torchvision.models.vision_transformer import VisionTransformer as TvViT

    from .weights import torchvision as tvw

    c = model.cfg
    h, w = c.img_hw
    if h != w or c.pool != "token" or c.pos_embed != "learned" or c.layer_norm_eps != 1e-6 or not c.qkv_bias:
        raise ValueError("torchvision's ViT needs a square image, pool='token', learned pos-emb, eps 1e-6, qkv bias")
    peer = TvViT(image_size=h, patch_size=c.patch_size, num_layers=c.depth, num_heads=c.num_heads,
                 hidden_dim=c.embed_dim, mlp_dim=c.mlp_dim, num_classes=c.num_classes)
    if c.in_chans != 3:
        peer.conv_proj = nn.Conv2d(c.in_chans, c.embed_dim, c.patch_size, stride=c.patch_size)
    names = {k: k for k in peer.state_dict()}
    ours_to_tv = {ours: tv for ours, tv in tvw.to_ours(names, "torchvision").items()}  # renaming only
    ours = model.state_dict()
    peer.load_state_dict({tv: ours[k] for k, tv in ours_to_tv.items()}, strict=True)
    return peer


def build_transformers(model: VisionTransformer) -> nn.Module:
    """transformers' ViTForImageClassification (SDPA attention) with our weights; q, k, v split from qkv."""
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    c = model.cfg
    h, w = c.img_hw
    if h != w or c.pool != "token" or c.pos_embed != "learned":
        raise ValueError("transformers' ViT needs a square image, pool='token' and learned pos-emb")
    hf_cfg = HFConfig(
        hidden_size=c.embed_dim, num_hidden_layers=c.depth, num_attention_heads=c.num_heads,
        intermediate_size=c.mlp_dim, hidden_act="gelu", image_size=h, patch_size=c.patch_size,
        num_channels=c.in_chans, layer_norm_eps=c.layer_norm_eps, qkv_bias=c.qkv_bias, num_labels=c.num_classes,
        attn_implementation="sdpa",
    )
    peer = ViTForImageClassification(hf_cfg)
    ours = model.state_dict()
    keys = set(peer.state_dict())
    state = {
        "vit.embeddings.cls_token": ours["cls_token"],
        "vit.embeddings.position_embeddings": ours["pos_embed"],
        "vit.embeddings.patch_embeddings.projection.weight": ours["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": ours["patch_embed.proj.bias"],
        "vit.layernorm.weight": ours["norm.weight"], "vit.layernorm.bias": ours["norm.bias"],
        "classifier.weight": ours["head.weight"], "classifier.bias": ours["head.bias"],
    }
    old = "vit.encoder.layer.0.attention.attention.query.weight" in keys  # transformers < 5 module names
    names = ({"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
              "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"} if old else
             {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.o_proj",
              "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"})
    qkv_names = (("attention.attention.query", "attention.attention.key", "attention.attention.value") if old
                 else ("attention.q_proj", "attention.k_proj", "attention.v_proj"))
    for i in range(c.depth):
        layer = f"vit.encoder.layer.{i}" if old else f"vit.layers.{i}"
        for kind in ("weight", "bias"):
            for a, b in names.items():
                state[f"{layer}.{b}.{kind}"] = ours[f"blocks.{i}.{a}.{kind}"]
            qkv = ours.get(f"blocks.{i}.attn.qkv.{kind}")
            if qkv is not None:
                for name, part in zip(qkv_names, qkv.chunk(3, dim=0)):  # rows: q, then k, then v
                    state[f"{layer}.{name}.{kind}"] = part
    peer.load_state_dict(state, strict=True)
    return _Logits(peer)


class _OnnxRuntime:
    """Our model exported to ONNX (fp32), run by onnxruntime's CPU provider with the same thread count."""

    def __init__(self, model: VisionTransformer, threads: int):
        import onnxruntime as ort

        from .export import export_onnx

        self._dir = tempfile.TemporaryDirectory(prefix="vitlab-bench-")
        path = Path(self._dir.name) / "model.onnx"
        export_onnx(model.float(), path, verify_batches=())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(["logits"], {"images": x.numpy()})[0])


BUILDERS: dict[str, Callable[[VisionTransformer], nn.Module]] = {
    "timm": build_timm, "transformers": build_transformers, "torchvision": build_torchvision,
}


# -- results ----------------------------------------------------------------------------------------------


@dataclass
class Result:
    """One candidate in one setting: seconds per call over the rounds and what follows from them."""

    task: str  # "infer" | "train"
    name: str  # "ours", "timm", ..., "ours[int8]"
    dtype: str  # compute dtype: fp32 | bf16 | fp16 | int8
    batch: int
    seconds: list[float]
    flops_per_call: float
    peak_flops: float | None
    peak_memory_bytes: int | None = None
    ratio_vs: dict[str, float] = field(default_factory=dict)  # peer -> (peer time / our time), median of pairs
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def summary(self) -> dict:
        d = asdict(self)
        med = self.median
        d.update(
            median_s=med, min_s=min(self.seconds), max_s=max(self.seconds),
            images_per_s=self.batch / med, images_per_s_min=self.batch / max(self.seconds),
            images_per_s_max=self.batch / min(self.seconds), latency_ms=1e3 * med,
            gflops_per_s=self.flops_per_call / med / 1e9,
            mfu=(self.flops_per_call / med / self.peak_flops) if self.peak_flops else None,
        )
        return d


def _paired_ratios(results: list[Result]) -> None:
    """Fill `ratio_vs` of each of our entries with, per peer, the median over rounds of (peer time / our time).

    Plain `ours` is compared with the peers in the same dtype; a speed mode (`ours[int8]`, ...) with the peers'
    fp32 eager inference, the baseline a user would otherwise run.
    """
    for r in results:
        if not r.name.startswith("ours"):
            continue
        for p in results:
            if p.name.startswith("ours") or p.task != r.task or p.batch != r.batch:
                continue
            mode_vs_fp32 = r.task == "infer" and r.name.startswith("ours[") and p.dtype == "fp32"
            if p.dtype == r.dtype or mode_vs_fp32:
                n = min(len(r.seconds), len(p.seconds))
                r.ratio_vs[f"{p.name}/{p.dtype}"] = statistics.median(p.seconds[i] / r.seconds[i] for i in range(n))


# -- the benchmark ----------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """What to measure. `overrides` change the variant's config (e.g. depth=2 for a quick run)."""

    model: str = "ViT-B/16"
    img_size: int = 224
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    peers: tuple[str, ...] = PEERS
    modes: tuple[str, ...] = ("int8", "compile")
    train_batch: int | None = 32
    train_peers: tuple[str, ...] = ("timm", "transformers", "torchvision")
    grad_checkpointing: bool = True
    warmup: int = 2
    rounds: int = 5
    iters: int = 1
    threads: int | None = None
    device: str = "cpu"
    peak_size: int = 2048
    overrides: dict = field(default_factory=dict)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _check_same(name: str, fn: Callable, x: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    with torch.inference_mode():
        out = fn(x).float()
    diff = (out - ref).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"{name}: logits differ from ours by {diff:.2e} (> {atol:g}): not the same model")


def run_bench(bc: BenchConfig) -> dict:
    """Run the whole benchmark; return the JSON-able results (machine, peaks, results, ratios)."""
    if bc.threads:
        torch.set_num_threads(bc.threads)
    device = bc.device
    for m in bc.modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    for d in bc.dtypes:
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for p in set(bc.peers) | set(bc.train_peers):
        if p not in PEERS:
            raise ValueError(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")
    cfg = ViTConfig.from_name(bc.model, img_size=bc.img_size, **bc.overrides)
    if cfg.representation_size:
        cfg = cfg.replace(representation_size=None)  # the peers' classifiers have no pre-logits layer
    torch.manual_seed(0)
    ours = create_model(cfg).eval().to(device)
    with torch.no_grad():  # the zero-initialised head would make every logit 0: give the check something to see
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    out: dict = {"machine": machine_info(), "config": {**asdict(bc), "vit": cfg.to_dict()}}

    _log("measuring matmul peaks ...")
    n = bc.peak_size
    peaks = {d: matmul_peak(DTYPES[d], device, n) for d in ("fp32", "bf16")}
    if "fp16" in bc.modes:
        peaks["fp16"] = matmul_peak(torch.float16, device, n)
    if "int8" in bc.modes and device == "cpu":
        peaks["int8"] = matmul_peak(torch.int8, device, n)
    out["matmul_peak_gflops"] = {k: v / 1e9 for k, v in peaks.items()}

    flops_fwd = count_flops(cfg, bc.img_size)
    results: list[Result] = []
    skipped: dict[str, str] = {}

    # inference: per dtype, ours + peers in that dtype; our speed modes alongside fp32
    g = torch.Generator().manual_seed(1)
    xc = torch.randn(2, cfg.in_chans, *cfg.img_hw, generator=g).to(device)  # the same-weights check
    with torch.inference_mode():
        ref = ours(xc)
    for dname in bc.dtypes:
        dtype = DTYPES[dname]
        cands: dict[str, tuple[Callable, str]] = {"ours": (_copy_of(ours).to(dtype), dname)}
        for peer in bc.peers:
            if peer == "onnxruntime" and (dname != "fp32" or device != "cpu"):
                continue
            try:
                if peer == "onnxruntime":
                    cands[peer] = (_OnnxRuntime(ours, torch.get_num_threads()), "fp32")
                else:
                    cands[peer] = (BUILDERS[peer](ours).eval().to(dtype), dname)
            except (ImportError, ValueError) as e:
                skipped[f"{peer}/{dname}"] = str(e)
                _log(f"skipping {peer} ({dname}): {e}")
        if dname == "fp32":
            for mode in bc.modes:
                _log(f"preparing mode {mode} ...")
                fast = optimize(ours, mode)
                cands[f"ours[{mode}]"] = (fast, "int8" if mode == "int8" else _DTYPE_NAMES[fast.dtype])
        for name, (fn, _) in cands.items():  # same weights, same function: checked, not assumed
            if not name.startswith("ours["):
                xin = xc if name == "onnxruntime" else xc.to(dtype)
                _check_same(name, fn, xin, ref, atol=1e-3 if dname == "fp32" else 0.1 * ref.abs().max().item())

        for b in bc.batch_sizes:
            x = torch.randn(b, cfg.in_chans, *cfg.img_hw, generator=g).to(device)
            calls = {}
            for name, (fn, _) in cands.items():
                xin = x if (name.startswith("ours[") or name == "onnxruntime") else x.to(dtype)
                calls[name] = _inference_call(fn, xin)
            _log(f"inference {dname} batch {b}: warm-up {', '.join(calls)}")
            for call in calls.values():
                for _ in range(bc.warmup):
                    call()
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(bc.rounds):  # interleaved: ours, peer, ..., ours, peer, ...
                for name, call in calls.items():
                    times[name] += _time_calls(call, 0, 1, bc.iters, device)
            for name, call in calls.items():
                cdt = cands[name][1]
                results.append(Result("infer", name, cdt, b, times[name], flops_fwd * b, peaks.get(cdt),
                                      peak_memory(call, device)))
                _log(f"  {name:<22} {b / statistics.median(times[name]):9.1f} img/s")
        del cands, calls

    # training: forward + backward + AdamW step, fp32 or bf16 autocast with fp32 master weights
    if bc.train_batch:
        results += _bench_training(ours, bc, cfg, peaks, skipped)
    _paired_ratios(results)
    out["skipped"] = skipped
    out["results"] = [r.summary() for r in results]
    out["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return out


def _inference_call(fn: Callable, x: torch.Tensor) -> Callable[[], object]:
    def call():
        with torch.inference_mode():
            return fn(x)

    return call


def _bench_training(ours: VisionTransformer, bc: BenchConfig, cfg: ViTConfig, peaks: dict, skipped: dict):
    device, b = bc.device, bc.train_batch
    flops = count_flops(cfg, bc.img_size, backward=True) * b
    g = torch.Generator().manual_seed(2)
    x = torch.randn(b, cfg.in_chans, *cfg.img_hw, generator=g).to(device)
    y = torch.randint(0, max(cfg.num_classes, 1), (b,), generator=g).to(device)
    results = []
    for dname in bc.dtypes:
        models: dict[str, nn.Module] = {"ours": _copy_of(ours)}
        if bc.grad_checkpointing:
            m = _copy_of(ours)
            m.set_grad_checkpointing(True)
            models["ours[grad-ckpt]"] = m
        for peer in bc.train_peers:
            if peer == "onnxruntime":
                continue
            try:
                models[peer] = BUILDERS[peer](ours).to(device)
            except (ImportError, ValueError) as e:
                skipped[f"train/{peer}"] = str(e)
        steps = {name: _train_step(m, x, y, DTYPES[dname], device) for name, m in models.items()}
        _log(f"training {dname} batch {b}: warm-up {', '.join(steps)}")
        for step in steps.values():
            for _ in range(bc.warmup):
                step()
        times = {name: [] for name in steps}
        for _ in range(bc.rounds):
            for name, step in steps.items():
                times[name] += _time_calls(step, 0, 1, bc.iters, device)
        for name, step in steps.items():
            results.append(Result("train", name, dname, b, times[name], flops, peaks.get(dname),
                                  peak_memory(step, device)))
            _log(f"  {name:<22} {b / statistics.median(times[name]):9.1f} img/s")
        del models, steps
    return results


def _copy_of(model: VisionTransformer) -> VisionTransformer:
    m = VisionTransformer(model.cfg).to(next(model.parameters()).device)
    m.load_state_dict(model.state_dict())
    return m


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype, device: str) -> Callable:
    """One optimiser step; bf16 runs under autocast with fp32 master weights (how a ViT is trained in bf16)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05)
    amp = torch.autocast(device.split(":")[0], dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

    def step():
        with amp:
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


# -- output -----------------------------------------------------------------------------------------------


def format_table(out: dict) -> str:
    """The results as a fixed-width table: one row per candidate and setting."""
    m = out["machine"]
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in out["matmul_peak_gflops"].items())
    vit = out["config"]["vit"]
    lines = [
        f"{out['config']['model']} at {vit['img_size']} px (depth {vit['depth']}, width {vit['embed_dim']}); "
        f"{m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}; load {m['loadavg_start']} -> "
        f"{m.get('loadavg_end')}",
        f"matmul peak GFLOP/s: {peaks}",
    ]
    head = (f"{'task':<6}{'batch':>6} {'candidate':<22}{'dtype':<6}{'img/s':>9}{'(min-max)':>18}{'lat ms':>10}"
            f"{'GFLOP/s':>9}{'MFU':>7}{'mem MiB':>9}  ratio (peer time / ours)")
    lines += [head, "-" * len(head)]
    for r in out["results"]:
        ratios = " ".join(f"{k} {v:.2f}x" for k, v in r["ratio_vs"].items())
        mem = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] is not None else "-"
        mfu = f"{100 * r['mfu']:.0f}%" if r["mfu"] is not None else "-"
        rng = f"({r['images_per_s_min']:.1f}-{r['images_per_s_max']:.1f})"
        lines.append(
            f"{r['task']:<6}{r['batch']:>6} {r['name']:<22}{r['dtype']:<6}{r['images_per_s']:>9.1f}{rng:>18}"
            f"{r['latency_ms']:>10.1f}{r['gflops_per_s']:>9.1f}{mfu:>7}{mem:>9}  {ratios}"
        )
    lines.append("MFU: achieved FLOP/s (count_flops, attention included) / measured matmul peak in the same dtype; "
                 "ratios are medians of per-round pairs, >1 means ours is faster.")
    for k, v in out.get("skipped", {}).items():
        lines.append(f"skipped {k}: {v}")
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    """A bar chart of images/s (median, min-max whiskers) per setting and candidate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def panel(r: dict) -> tuple[str, str, int]:  # speed modes ran beside the fp32 eager candidates
        mode = r["task"] == "infer" and r["name"].startswith("ours[")
        return r["task"], "fp32" if mode else r["dtype"], r["batch"]

    settings = sorted({panel(r) for r in out["results"]})
    fig, axes = plt.subplots(1, len(settings), figsize=(3.2 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        task, dname, b = setting
        rows = [r for r in out["results"] if panel(r) == setting]
        names = [r["name"] for r in rows]
        vals = [r["images_per_s"] for r in rows]
        err = [[v - r["images_per_s_min"] for v, r in zip(vals, rows)],
               [r["images_per_s_max"] - v for v, r in zip(vals, rows)]]
        colors = ["tab:blue" if n.startswith("ours") else "tab:gray" for n in names]
        ax.bar(range(len(rows)), vals, yerr=err, color=colors, capsize=3)
        ax.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{task} {dname} b={b}", fontsize=9)
        ax.set_ylabel("images/s" if ax is axes[0][0] else "")
    fig.suptitle(f"{out['config']['model']} @ {out['config']['img_size']} px on {out['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    with _atomic(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


@contextlib.contextmanager
def _atomic(path: Path):
    """Write beside `path` and rename in one step, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_outputs(out: dict, out_dir: Path, png: bool = True) -> list[Path]:
    """bench.json, bench.txt (the table) and bench.png in `out_dir` (results of a benchmark: replaced)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "bench.json", out_dir / "bench.txt"]
    with _atomic(paths[0]) as tmp, open(tmp, "w") as f:
        json.dump(out, f, indent=1, default=_json_default)
    with _atomic(paths[1]) as tmp, open(tmp, "w") as f:
        f.write(format_table(out) + "\n")
    if png:
        plot(out, out_dir / "bench.png")
        paths.append(out_dir / "bench.png")
    return paths


def _json_default(o):
    if isinstance(o, torch.dtype):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# -- accuracy cost of the speed modes ---------------------------------------------------------------------


def mode_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor | None, modes: tuple[str, ...],
                  batch_size: int = 256) -> dict[str, dict]:
    """Top-1 agreement of each mode with fp32 and, with labels, each mode's accuracy.

    Args:
        model: The fp32 model.
        images: (N, C, H, W) preprocessed test images.
        labels: (N,) class indices, or None.
        modes: Speed modes to compare with fp32.
    """
    model = model.eval()
    fns = {"fp32": model, **{m: optimize(model, m) for m in modes if m != "fp32"}}
    preds: dict[str, list[torch.Tensor]] = {m: [] for m in fns}
    with torch.inference_mode():
        for i in range(0, len(images), batch_size):
            x = images[i : i + batch_size]
            for m, fn in fns.items():
                preds[m].append(fn(x).float().argmax(1))
    ref = torch.cat(preds["fp32"])
    report = {}
    for m in fns:
        p = torch.cat(preds[m])
        report[m] = {"agreement_with_fp32": (p == ref).float().mean().item()}
        if labels is not None:
            report[m]["accuracy"] = (p == labels).float().mean().item()
    return report


# -- CLI --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="ViT-B/16", help="variant name (default %(default)s)")
    p.add_argument("--img-size", type=int, default=224, help="square input size in pixels (default %(default)s)")
    p.add_argument("--depth", type=int, help="override the number of blocks (quick runs)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    p.add_argument("--modes", nargs="*", default=["int8", "compile"], choices=MODES,
                   help="our speed modes to measure alongside fp32 (vitlab.optimize)")
    p.add_argument("--train-batch", type=int, default=32, help="batch of the training step; 0 skips training")
    p.add_argument("--train-peers", nargs="*", default=["timm", "transformers", "torchvision"],
                   choices=PEERS[:3])
    p.add_argument("--no-grad-checkpointing", action="store_true", help="skip the gradient-checkpointing run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per candidate")
    p.add_argument("--iters", type=int, default=1, help="calls per round")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-size", type=int, default=2048, help="side of the square matmuls that measure the peak")
    p.add_argument("--out", default="bench-results", help="folder for bench.json, bench.txt, bench.png")
    p.add_argument("--no-png", action="store_true")


def run(args: argparse.Namespace) -> int:
    for name in ("batch_sizes",):
        if any(v <= 0 for v in getattr(args, name)):
            print(f"error: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    if args.rounds < 1 or args.iters < 1 or args.warmup < 0 or args.train_batch < 0:
        print("error: --rounds and --iters must be >= 1, --warmup and --train-batch >= 0", file=sys.stderr)
        return 2
    overrides = {"num_classes": args.num_classes}
    if args.depth:
        overrides["depth"] = args.depth
    bc = BenchConfig(
        model=args.model, img_size=args.img_size, batch_sizes=tuple(args.batch_sizes), dtypes=tuple(args.dtypes),
        peers=tuple(args.peers), modes=tuple(args.modes), train_batch=args.train_batch or None,
        train_peers=tuple(args.train_peers), grad_checkpointing=not args.no_grad_checkpointing,
        warmup=args.warmup, rounds=args.rounds, iters=args.iters, threads=args.threads, device=args.device,
        peak_size=args.peak_size,
        overrides=overrides,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            out = run_bench(bc)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_table(out))
    for path in write_outputs(out, Path(args.out), png=not args.no_png):
        print(f"wrote {path}")
    return 0
