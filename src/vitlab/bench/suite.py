"""The benchmark itself: our ViT and its peers, same shape and weights, timed interleaved; and the accuracy cost
of our speed modes.

    from vitlab.bench import BenchConfig, run_bench, write_outputs
    out = run_bench(BenchConfig(model="ViT-Ti/16", img_size=32, overrides={"depth": 2}))
    write_outputs(out, Path("/tmp/b"))

Progress is logged at INFO level under `vitlab.bench.suite` (the CLI shows it; a library caller opts in).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..data import first_images, parse_data_spec
from ..deploy.optimize import CALIBRATED_MODES, MODES, optimize
from ..models.config import ViTConfig
from ..models.flops import count_flops
from ..models.vit import VisionTransformer
from ..perf import precision
from ..weights import create_model
from .peers import BUILDERS, PEERS, RUNTIME_PEERS, build_runtime
from .timing import loadavg, machine_info, matmul_peak, peak_memory, perturb_

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# idle before each timed call when a candidate runs its own thread pool: ONNX Runtime's intra-op threads spin for
# ~20-50 ms after a call; timed right after another ONNX Runtime session, its batch-1 call took 1.45x as long
# (2-core Zen 4, 2026-12-07; 0.05 s of idle was enough there)
SETTLE_S = 0.3
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


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
    agreement: float | None = None  # inference: top-1 agreement with our fp32 model on the accuracy images
    max_logit_diff: float | None = None  # inference: max |logits - our fp32 logits| on the same images
    mode: str | None = None  # our speed modes: the mode that ran (for "auto", the one it chose)

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

    Plain `ours` is compared with the peers in the same dtype; a speed mode (`ours[int8]`, ...) also with the peers'
    fp32 eager inference, the baseline a user would otherwise run; `ours[auto]` (whatever mode it picked) with every
    peer, each at its own dtype: the fastest vitlab against each peer's settings.
    """
    for r in results:
        if not r.name.startswith("ours"):
            continue
        for p in results:
            if p.name.startswith("ours") or p.task != r.task or p.batch != r.batch:
                continue
            mode_vs_fp32 = r.task == "infer" and r.name.startswith("ours[") and p.dtype == "fp32"
            if p.dtype == r.dtype or mode_vs_fp32 or r.name == "ours[auto]":
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
    accuracy_data: str | None = "fashion_mnist"  # data spec of the real images for the accuracy cost (None: random)
    accuracy_images: int = 64  # test images each inference candidate is compared with fp32 on (0: none)
    calib_images: int = 300  # training images the int8 runtimes calibrate on (NNCF's default subset size)


def _check_same(name: str, fn: Callable, x: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    with torch.inference_mode():
        out = fn(x).float()
    diff = (out - ref).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"{name}: logits differ from ours by {diff:.2e} (> {atol:g}): not the same model")


def _check_tolerance(cdt: str, ref: torch.Tensor) -> float:
    """How far a candidate computing in `cdt` may be from our fp32 logits and still be the same model: 1e-3 in
    fp32, a tenth of the largest logit in bf16."""
    return 1e-3 if cdt == "fp32" else 0.1 * ref.abs().max().item()


def _check_correlated(name: str, fn: Callable, x: torch.Tensor, ref: torch.Tensor, least: float = 0.9) -> None:
    """An int8 candidate is the same model when its logits correlate with ours (Pearson r over all logits of `x`):
    int8 rounding moves logits by a fraction of their spread, other weights leave r near 0."""
    with torch.inference_mode():
        out = fn(x).float()
    r = torch.corrcoef(torch.stack([out.flatten(), ref.float().flatten()]))[0, 1].item()
    if not r >= least:
        raise RuntimeError(f"{name}: logits correlate with ours at r = {r:.3f} (< {least}): not the same model")


def _real_images(bc: BenchConfig, cfg: ViTConfig, split: str, n: int) -> tuple[torch.Tensor, str]:
    """(n, C, H, W) images of `split` of `bc.accuracy_data` prepared at the model's size (grey repeated for RGB),
    and where they came from; random images when there is no such data here."""
    if bc.accuracy_data and n > 0:
        try:
            dc = parse_data_spec(bc.accuracy_data).replace(expand_channels=cfg.in_chans == 3)
            images = first_images(dc, split, n, img_size=cfg.img_hw, in_chans=cfg.in_chans)
            if images is not None:
                return images, f"{bc.accuracy_data}/{split}"
        except (OSError, ValueError) as e:
            log.info("no %s images of %s (%s): random images instead", split, bc.accuracy_data, e)
    g = torch.Generator().manual_seed(3)
    return torch.randn(max(n, 0), cfg.in_chans, *cfg.img_hw, generator=g), "random"


def run_bench(bc: BenchConfig) -> dict:
    """Run the whole benchmark; return the JSON-able results (machine, peaks, results, ratios)."""
    _validate(bc)
    if bc.threads:
        torch.set_num_threads(bc.threads)
    cfg = ViTConfig.from_name(bc.model, img_size=bc.img_size, **bc.overrides)
    if cfg.representation_size:
        cfg = cfg.replace(representation_size=None)  # the peers' classifiers have no pre-logits layer
    torch.manual_seed(0)
    ours = perturb_(create_model(cfg).eval()).to(bc.device)
    out: dict = {"machine": machine_info(), "config": {**asdict(bc), "vit": cfg.to_dict()}}
    peaks = _matmul_peaks(bc)
    out["matmul_peak_gflops"] = {k: v / 1e9 for k, v in peaks.items()}
    skipped: dict[str, str] = {}
    results = _bench_inference(ours, bc, cfg, peaks, skipped)
    if bc.train_batch:  # forward + backward + AdamW step, fp32 or bf16 autocast with fp32 master weights
        results += _bench_training(ours, bc, bc.train_batch, cfg, peaks, skipped)
    _paired_ratios(results)
    # The peaks again at the end, the larger kept: a peak is an upper bound, and a busy moment (or, on this VM, a
    # phase where int8 ran at half rate: 450 against 856 GFLOP/s at the start of two idle runs, 2026-12-07) only
    # lowers it, which would put the MFU of every int8 row above 100%.
    end = _matmul_peaks(bc)
    out["matmul_peak_gflops_start"] = out["matmul_peak_gflops"]
    out["matmul_peak_gflops_end"] = {k: v / 1e9 for k, v in end.items()}
    peaks = {k: max(v, end.get(k, 0.0)) for k, v in peaks.items()}
    out["matmul_peak_gflops"] = {k: v / 1e9 for k, v in peaks.items()}
    for r in results:
        r.peak_flops = peaks.get(r.dtype)
    out["skipped"] = skipped
    host = out["machine"]["host_class"]
    out["results"] = [{"host_class": host, **r.summary()} for r in results]  # every number says its CPU class
    out["machine"]["loadavg_end"] = loadavg()
    return out


def _validate(bc: BenchConfig) -> None:
    for what, values, known in (("mode", bc.modes, MODES), ("dtype", bc.dtypes, DTYPES),
                                ("peer", (*bc.peers, *bc.train_peers), PEERS)):
        for v in values:
            if v not in known:
                raise ValueError(f"unknown {what} {v!r}; choose from {', '.join(known)}")
    if bc.accuracy_images < 0 or bc.calib_images < 1:
        raise ValueError(f"need accuracy_images >= 0 and calib_images >= 1, got {bc.accuracy_images}, "
                         f"{bc.calib_images}")


def _int8_peers(bc: BenchConfig) -> bool:
    """Whether an int8 runtime (calibrated or dynamic) is among the peers."""
    return any(RUNTIME_PEERS.get(p, {}).get("fp32") == "int8" for p in bc.peers)


def _matmul_peaks(bc: BenchConfig) -> dict[str, float]:
    """FLOP/s peaks per compute dtype the candidates use (fp16 only for the fp16 mode; int8 on the CPU when an int8
    mode, `auto` or an int8 runtime runs)."""
    log.info("measuring matmul peaks ...")
    device, n = bc.device, bc.peak_size
    peaks = {d: matmul_peak(DTYPES[d], device, n) for d in ("fp32", "bf16")}
    if "fp16" in bc.modes:
        peaks["fp16"] = matmul_peak(torch.float16, device, n)
    if device == "cpu" and (_int8_peers(bc) or any("int8" in m or m == "auto" for m in bc.modes)):
        peaks["int8"] = matmul_peak(torch.int8, device, n)
    return peaks


def _time_interleaved(calls: dict[str, Callable[[], object]], bc: BenchConfig) -> dict[str, list[float]]:
    """Warm each call up, then time rounds in turn (a, b, c, then b, c, a, ...) so load changes hit all alike
    (`vitlab.perf.precision.time_rounds`, the one timer); with a runtime peer or one of our modes among them (ONNX
    Runtime, OpenVINO, a mode `auto` may pick: their own thread pools, which spin on after a call) `SETTLE_S` of
    idle before each timed call."""
    settle = SETTLE_S if any(name in RUNTIME_PEERS or name.startswith("ours[") for name in calls) else 0.0
    return precision.time_rounds(lambda name: calls[name](), list(calls), device=bc.device, warmup=bc.warmup,
                                 rounds=bc.rounds, iters=bc.iters, settle_s=settle)


def _inference_candidates(ours: VisionTransformer, bc: BenchConfig, dname: str, skipped: dict[str, str],
                          calib: torch.Tensor | None) -> dict[str, tuple[Callable, str]]:
    """name -> (callable, compute dtype): ours and the peers in `dname`; alongside fp32 also our speed modes and
    the int8 runtimes (calibrated on `calib`)."""
    dtype, device = DTYPES[dname], bc.device
    cands: dict[str, tuple[Callable, str]] = {"ours": (_copy_of(ours).to(dtype), dname)}
    for peer in bc.peers:
        if peer in RUNTIME_PEERS and (dname not in RUNTIME_PEERS[peer] or device != "cpu"):
            continue
        try:
            if peer in RUNTIME_PEERS:
                log.info("building %s (%s) ...", peer, dname)
                built = build_runtime(peer, ours, dname, torch.get_num_threads(), calib)
                if built is not None:
                    cands[peer] = built
            else:
                cands[peer] = (BUILDERS[peer](ours).eval().to(dtype), dname)
        except (ImportError, ValueError) as e:
            skipped[f"{peer}/{dname}"] = str(e)
            log.info("skipping %s (%s): %s", peer, dname, e)
    if dname == "fp32":
        for mode in bc.modes:
            log.info("preparing mode %s ...", mode)
            fast = optimize(ours, mode, calib=calib if mode in CALIBRATED_MODES else None)
            chosen = fast.mode  # what runs: `auto` picks one of the others (its dtype is that mode's)
            cands[f"ours[{mode}]"] = (fast, "int8" if "int8" in chosen else _DTYPE_NAMES[fast.dtype])
    return cands


def _bench_inference(ours: VisionTransformer, bc: BenchConfig, cfg: ViTConfig, peaks: dict, skipped: dict
                     ) -> list[Result]:
    """Per dtype, ours and the peers in that dtype (our speed modes alongside fp32), each batch size."""
    device, flops_fwd = bc.device, count_flops(cfg, bc.img_size)
    g = torch.Generator().manual_seed(1)
    xc = torch.randn(2, cfg.in_chans, *cfg.img_hw, generator=g).to(device)  # the same-weights check
    with torch.inference_mode():
        ref = ours(xc)
    acc_x, acc_src = _real_images(bc, cfg, "test", bc.accuracy_images)  # the accuracy cost: real images
    with torch.inference_mode():
        acc_ref = _logits(ours, acc_x.to(device), bc)
    calib = None
    if (_int8_peers(bc) or any(m in CALIBRATED_MODES for m in bc.modes)) and "fp32" in bc.dtypes:
        calib, calib_src = _real_images(bc, cfg, "train", bc.calib_images)
        log.info("int8 runtimes and modes calibrate on %d images of %s", len(calib), calib_src)
    results = []
    for dname in bc.dtypes:
        dtype = DTYPES[dname]
        cands = _inference_candidates(ours, bc, dname, skipped, calib)
        accuracy: dict[str, tuple[float | None, float | None]] = {}
        for name, (fn, cdt) in cands.items():  # same weights, same function: checked, not assumed
            fp32_in = name.startswith("ours[") or name in RUNTIME_PEERS
            if not name.startswith("ours[") and cdt == "int8":  # calibrated: checked on real images
                xk, refk = (acc_x[:16], acc_ref[:16]) if len(acc_x) else (xc, ref)
                _check_correlated(name, fn, xk, refk)
            elif not name.startswith("ours["):
                _check_same(name, fn, xc if fp32_in else xc.to(dtype), ref, atol=_check_tolerance(cdt, ref))
            accuracy[name] = _accuracy_cost(fn, acc_x if fp32_in else acc_x.to(dtype), acc_ref, bc)
        for b in bc.batch_sizes:
            x = torch.randn(b, cfg.in_chans, *cfg.img_hw, generator=g).to(device)
            calls = {}
            for name, (fn, _) in cands.items():
                xin = x if (name.startswith("ours[") or name in RUNTIME_PEERS) else x.to(dtype)
                calls[name] = _inference_call(fn, xin)
            log.info("inference %s batch %d: warm-up %s", dname, b, ", ".join(calls))
            times = _time_interleaved(calls, bc)
            for name, call in calls.items():
                fn, cdt = cands[name]
                results.append(Result("infer", name, cdt, b, times[name], flops_fwd * b, peaks.get(cdt),
                                      peak_memory(call, device), agreement=accuracy[name][0],
                                      max_logit_diff=accuracy[name][1],
                                      note=f"accuracy on {len(acc_x)} {acc_src} images" if len(acc_x) else "",
                                      mode=getattr(fn, "mode", None) if name.startswith("ours[") else None))
                log.info("  %-22s %9.1f img/s", name, b / statistics.median(times[name]))
        del cands, calls
    return results


def _logits(fn: Callable, x: torch.Tensor, bc: BenchConfig) -> torch.Tensor:
    """fp32 logits of `fn` over `x` in chunks of the largest benchmarked batch (at most 32)."""
    chunk = max(1, min(32, max(bc.batch_sizes)))
    if len(x) == 0:
        return torch.empty(0)
    return torch.cat([fn(x[i : i + chunk]).float().cpu() for i in range(0, len(x), chunk)])


def _accuracy_cost(fn: Callable, x: torch.Tensor, ref: torch.Tensor, bc: BenchConfig
                   ) -> tuple[float | None, float | None]:
    """(top-1 agreement with `ref`, max |logit difference|) of `fn` on `x`; (None, None) without images."""
    if len(x) == 0:
        return None, None
    with torch.inference_mode():
        out = _logits(fn, x.to(bc.device), bc)
    return (out.argmax(1) == ref.argmax(1)).float().mean().item(), (out - ref).abs().max().item()


def _inference_call(fn: Callable, x: torch.Tensor) -> Callable[[], object]:
    def call():
        with torch.inference_mode():
            return fn(x)

    return call


def _bench_training(ours: VisionTransformer, bc: BenchConfig, b: int, cfg: ViTConfig, peaks: dict, skipped: dict
                    ) -> list[Result]:
    """One optimiser step of ours (with and without gradient checkpointing) and of the peers, per dtype, at batch
    size `b`."""
    device = bc.device
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
            if peer in RUNTIME_PEERS:  # inference only
                continue
            try:
                models[peer] = BUILDERS[peer](ours).to(device)
            except (ImportError, ValueError) as e:
                skipped[f"train/{peer}"] = str(e)
        steps = {name: _train_step(m, x, y, DTYPES[dname], device) for name, m in models.items()}
        log.info("training %s batch %d: warm-up %s", dname, b, ", ".join(steps))
        times = _time_interleaved(steps, bc)
        for name, step in steps.items():
            results.append(Result("train", name, dname, b, times[name], flops, peaks.get(dname),
                                  peak_memory(step, device)))
            log.info("  %-22s %9.1f img/s", name, b / statistics.median(times[name]))
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
