"""Training throughput: vitlab's trainer against a plain timm loop of the same model shape, interleaved rounds.

Two workloads (`--preset`):
- `fmnist` (default; `--config`, default configs/fmnist_hybrid.yaml): vitlab's own loop (in-memory Fashion-MNIST,
  whole-batch augmentation) against timm's ViT (for a hybrid recipe timm's ResNetV2 + HybridEmbed) in a standard
  PyTorch loop (torchvision FashionMNIST + per-image transforms + DataLoader, AdamW).
- `vit_s16`: ViT-S/16 at 224 px, batch 32, 1000 classes, on the same pre-made random batches for both sides (the
  model step alone: no data pipeline on either side).

"Same shape" is checked by loading timm's state dict into vitlab's model with strict=True. vitlab runs as a
recipe does: `precision: auto` decided by measuring (`vitlab.train.tune.train_precision`, cached per machine),
fused AdamW (`vitlab.train.optim`), torch.compile when the recipe sets it. The baseline is run in fp32 and with
bf16 autocast (eager; for fmnist each with the DataLoader in-process and with worker processes); the fastest of
these plain loops is the baseline of the ratio. Optionally (`--compiled-baseline`) timm with bf16 autocast under
torch.compile, a stronger reference than the target asks for, gets its own ratio line.
`--tuned-baseline` adds the strongest timm loop we know how to assemble from timm's and torch's own switches (bf16
autocast, timm's explicit attention instead of the CPU flash kernel (`fused_attn = False`), fused AdamW,
torch.compile): what is left of the ratio against it is vitlab's own (row-major weight gradients on AMX).
`--int8` adds vitlab with `train.int8` (int8 linear layers, SwitchBack: `vitlab.perf.int8_train`) as a second
vitlab loop in the same process as the first (each its own compiled graph), so the two are compared round by round.

Each loop runs in its own process, as a user would run it (ours with vitlab's allocator setting, see
src/vitlab/perf/allocator.py; the baseline with the default one), and the rounds are interleaved, the order reversed
every other round (A, B, C, C, B, A, ...), so that a machine shared with other jobs slows all alike, also while its
load rises or falls; only one side computes at a time. The table reports the
median images/s of each side and the load average (1 min) before each round.

    .venv/bin/python benchmarks/train_throughput.py --rounds 5 --steps 10 -o benchmarks/results/train_throughput.md
    .venv/bin/python benchmarks/train_throughput.py --preset vit_s16 --rounds 5 --steps 3 \
        -o benchmarks/results/train_throughput_vit_s16.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.train import load_recipe
from vitlab.train.loop import build_model, train_step
from vitlab.train.mixup import BatchMix
from vitlab.train.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
FMNIST = "/usr/share/datasets/fashion-mnist"


VIT_S16 = {"model": {"name": "ViT-S/16", "img_size": 224}, "data": {"dataset": "synthetic"},
           "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.05, "clip_grad_norm": 1.0},
           "train": {"batch_size": 32, "steps": 10, "compile": True, "precision": "auto"}}
NUM_CLASSES = {"fmnist": 10, "vit_s16": 1000}


def synthetic_batches(recipe, num_classes: int, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` fixed random batches of the recipe's input shape (the same on both sides, made from seed 0)."""
    cfg = recipe.model.model_config(num_classes=num_classes)
    g = torch.Generator().manual_seed(0)
    b = recipe.train.batch_size
    return [(torch.randn(b, cfg.in_chans, cfg.img_size, cfg.img_size, generator=g),
             torch.randint(0, num_classes, (b,), generator=g)) for _ in range(n)]


def vitlab_side(recipe, steps_per_round: int, preset: str):
    """A closure running `steps_per_round` steps of vitlab's own loop (stream + train_step, with the recipe's
    `train.int8`), returning images/s, and the precision `auto` chose (measured as a run measures it)."""
    import itertools

    from vitlab.train.tune import train_precision

    num_classes = NUM_CLASSES[preset]
    cfg = recipe.model.model_config(num_classes=num_classes)
    if preset == "fmnist":
        from vitlab.data import DataConfig, build_train_stream

        stream = build_train_stream(DataConfig.from_dict(recipe.data), img_size=cfg.img_size, in_chans=cfg.in_chans,
                                    batch_size=recipe.train.batch_size, seed=0)
    else:
        stream = itertools.cycle(synthetic_batches(recipe, num_classes))
    model = build_model(recipe, num_classes=num_classes)
    if recipe.train.int8:  # its own class, so torch.compile keeps a graph per side (one process runs both)
        model.__class__ = type(f"{type(model).__name__}Int8", (type(model),), {})
    shape = (recipe.train.batch_size, cfg.in_chans, cfg.img_size, cfg.img_size)
    precision = train_precision(model, lambda m: build_optimizer(m, recipe.optim), shape, num_classes, "cpu",
                                recipe.train.precision, clip_grad_norm=recipe.optim.clip_grad_norm)
    opt = build_optimizer(model, recipe.optim)
    net = torch.compile(model) if recipe.train.compile else model
    mix = BatchMix(num_classes, recipe.train.mixup, recipe.train.cutmix)
    dev = torch.device("cpu")

    def run() -> float:
        t = time.perf_counter()
        for _ in range(steps_per_round):
            train_step(net, opt, [next(stream)], lr=recipe.optim.lr, device=dev, precision=precision,
                       clip_grad_norm=recipe.optim.clip_grad_norm, label_smoothing=recipe.train.label_smoothing,
                       mix=mix, int8=recipe.train.int8)
        return steps_per_round * recipe.train.batch_size / (time.perf_counter() - t)

    return run, precision


def torchvision_root() -> str:
    """torchvision's FashionMNIST wants root/FashionMNIST/raw/<uncompressed IDX>; build that from Debian's .gz."""
    root = Path(tempfile.mkdtemp(prefix="fmnist_tv_"))
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        with gzip.open(f"{FMNIST}/{name}.gz", "rb") as src, open(raw / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return str(root)


def timm_model(cfg, num_classes: int = 10) -> torch.nn.Module:
    """timm's VisionTransformer of the same shape; for a hybrid, timm's BiT ResNetV2 + HybridEmbed (R50+ViT style)."""
    import timm.models.vision_transformer as tvit

    extra = {}
    if cfg.hybrid_layers is not None:
        from functools import partial

        from timm.layers import StdConv2dSame
        from timm.models.resnetv2 import ResNetV2
        from timm.models.vision_transformer_hybrid import HybridEmbed

        layers = tuple(cfg.hybrid_layers)
        backbone = ResNetV2(layers=layers, channels=tuple(4 * cfg.hybrid_width * 2 ** i for i in range(len(layers))),
                            stem_chs=cfg.hybrid_width, num_classes=0, global_pool="", in_chans=cfg.in_chans,
                            preact=False, stem_type="same", conv_layer=partial(StdConv2dSame, eps=1e-8))
        extra["embed_layer"] = partial(HybridEmbed, backbone=backbone)
    model = tvit.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=num_classes,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        global_pool="avg" if cfg.pool == "gap" else "token", class_token=cfg.class_token,
        fc_norm=False,  # LayerNorm on every token, then the pooling: vitlab's (and big_vision's) order
        pos_embed="learn" if cfg.pos_embed == "learned" else "none", **extra)
    # same shape means same parameter names and shapes: vitlab's model takes timm's weights as they are
    from vitlab.models.vit import VisionTransformer

    VisionTransformer(cfg.replace(num_classes=num_classes)).load_state_dict(model.state_dict(), strict=True)
    return model


def timm_side(recipe, steps_per_round: int, num_workers: int, root: str, precision: str = "fp32",
              compile: str = "", preset: str = "fmnist"):
    """The standard loop: timm VisionTransformer, torchvision dataset + v2 transforms, DataLoader, AdamW; fp32, or
    bf16 autocast (weights fp32) as a user would add it; optionally (`compile`: "compile" or "tuned", see
    `_timm_loop`) torch.compile'd, not a plain loop any more.
    For the vit_s16 preset the same fixed random batches as vitlab's side instead of a dataset."""
    num_classes = NUM_CLASSES[preset]
    cfg = recipe.model.model_config(num_classes=num_classes)
    if preset != "fmnist":
        import itertools

        loader = synthetic_batches(recipe, num_classes)
        return _timm_loop(recipe, steps_per_round, lambda: iter(itertools.cycle(loader)), cfg, num_classes,
                          precision, compile)
    import torchvision
    import torchvision.transforms.v2 as T

    d = recipe.data
    tf = T.Compose([
        T.RandomResizedCrop(cfg.img_size, scale=tuple(d.get("crop_scale", (0.08, 1.0))),
                            ratio=tuple(d.get("crop_ratio", (3 / 4, 4 / 3))), antialias=True),
        T.RandomHorizontalFlip(),
        T.ToImage(),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize([0.5], [0.5]),
    ])
    ds = torchvision.datasets.FashionMNIST(root, train=True, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=recipe.train.batch_size, shuffle=True, drop_last=True,
                                         num_workers=num_workers, persistent_workers=num_workers > 0)
    return _timm_loop(recipe, steps_per_round, lambda: iter(loader), cfg, num_classes, precision, compile)


def _timm_loop(recipe, steps_per_round: int, make_iter, cfg, num_classes: int, precision: str, compile: str):
    """The plain training loop of a timm user (AdamW with torch's default implementation, clipping); `compile`:
    "" eager, "compile" torch.compile, "tuned" also timm's explicit attention and fused AdamW."""
    model = timm_model(cfg, num_classes)
    tuned = compile == "tuned"
    if tuned:
        for m in model.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False  # timm's explicit softmax(QK^T)V (as TIMM_FUSED_ATTN=0 would set)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.optim.lr, weight_decay=recipe.optim.weight_decay,
                            **({"fused": True} if tuned else {}))
    net = torch.compile(model) if compile else model
    it = make_iter()

    def run() -> float:
        nonlocal it
        model.train()
        t = time.perf_counter()
        for _ in range(steps_per_round):
            try:
                x, y = next(it)
            except StopIteration:
                it = make_iter()
                x, y = next(it)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = net(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=recipe.train.label_smoothing)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optim.clip_grad_norm or float("inf"))
            opt.step()
        return steps_per_round * recipe.train.batch_size / (time.perf_counter() - t)

    return run


def baseline_variants(workers: int, preset: str, compiled: bool, tuned: bool = False
                      ) -> list[tuple[str, int, str, str]]:
    """(row label, DataLoader workers, precision, compile kind) of each baseline loop. The eager rows (kind "") are
    the plain loop the target is set against; the compiled and tuned rows are stronger references, beside it."""
    rows = []
    source = "torchvision DataLoader" if preset == "fmnist" else "fixed random batches"
    for precision, what in (("fp32", "fp32"), ("bf16", "bf16 autocast")):
        for w in (sorted({0, workers}) if preset == "fmnist" else (0,)):
            rows.append((f"timm + {source} ({what}, num_workers={w})", w, precision, ""))
    w = workers if preset == "fmnist" else 0
    if compiled:
        rows.append((f"timm + {source} (bf16 autocast, torch.compile, num_workers={w})", w, "bf16", "compile"))
    if tuned:
        rows.append((f"timm tuned + {source} (bf16 autocast, explicit attention, fused AdamW, torch.compile, "
                     f"num_workers={w})", w, "bf16", "tuned"))
    return rows


def make_recipe(preset: str, config: str, overrides: list[str]):
    from vitlab.train.recipe import Recipe, apply_overrides

    if preset == "fmnist":
        return load_recipe(config, overrides)
    return Recipe.from_dict(apply_overrides(VIT_S16, overrides))


def _baseline_process(conn, preset: str, config: str, overrides: list[str], steps: int, workers: int, threads: int,
                      root: str, compiled: bool, tuned: bool) -> None:
    """The baselines' own process: build both loops, then run a round whenever the parent asks for one."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    recipe = make_recipe(preset, config, overrides)
    sides = [timm_side(recipe, steps, w, root, precision, c, preset) for _, w, precision, c in
             baseline_variants(workers, preset, compiled, tuned)]
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        conn.send(sides[msg]())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=tuple(NUM_CLASSES), default="fmnist")
    p.add_argument("--config", default=str(ROOT / "configs" / "fmnist_hybrid.yaml"), help="recipe (fmnist preset)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of the baseline's second variant")
    p.add_argument("--compiled-baseline", action="store_true", help="also timm + bf16 autocast + torch.compile")
    p.add_argument("--tuned-baseline", action="store_true",
                   help="also timm + bf16 autocast + explicit attention + fused AdamW + torch.compile")
    p.add_argument("--int8", action="store_true",
                   help="also vitlab with train.int8 (int8 linear layers, SwitchBack) in the same process")
    p.add_argument("-o", "--output", default=None, help="write the table (Markdown) and a .json beside it")
    args = p.parse_args()
    import logging
    import multiprocessing as mp

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("vitlab.precision").setLevel(logging.INFO)  # what `auto` measured and chose

    from vitlab.perf.allocator import keep_freed_memory

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    recipe = make_recipe(args.preset, args.config, args.overrides)
    root = torchvision_root() if args.preset == "fmnist" else ""
    conn, child_conn = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=_baseline_process, args=(
        child_conn, args.preset, args.config, args.overrides, args.steps, args.workers, args.threads, root,
        args.compiled_baseline, args.tuned_baseline))
    child.start()
    ours, chosen = vitlab_side(recipe, args.steps, args.preset)  # measures `auto` while the child builds
    ours8 = None
    if args.int8:
        recipe8 = make_recipe(args.preset, args.config, [*args.overrides, "train.int8=true"])
        ours8, _ = vitlab_side(recipe8, args.steps, args.preset)
    if conn.recv() != "ready":
        raise RuntimeError("the baseline process did not start")

    def remote(key: int):
        def run() -> float:
            conn.send(key)
            return conn.recv()
        return run

    allocator = "tuned allocator" if keep_freed_memory() else "default allocator"
    compile_note = ", torch.compile" if recipe.train.compile else ""
    data_note = "in-memory batch augmentation" if args.preset == "fmnist" else "fixed random batches"
    variants = baseline_variants(args.workers, args.preset, args.compiled_baseline, args.tuned_baseline)
    ours_label = (f"vitlab ({recipe.train.precision} -> {chosen}{compile_note}, fused AdamW, {data_note}, "
                  f"{allocator})")
    int8_label = ours_label.replace("vitlab (", "vitlab int8 linears (", 1)
    sides = {ours_label: ours, **({int8_label: ours8} if ours8 else {}),
             **{label: remote(i) for i, (label, *_) in enumerate(variants)}}
    plain = [label for label, _, _, c in variants if not c]
    compiled = [label for label, _, _, c in variants if c == "compile"]
    tuned = [label for label, _, _, c in variants if c == "tuned"]
    for run in sides.values():  # warm-up round (compilation), not counted
        run()
    results: dict[str, list[float]] = {name: [] for name in sides}
    loads: list[float] = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = list(sides.items())  # A, B, C then C, B, A: a load that rises or falls evens out over two rounds
        for name, run in order if r % 2 == 0 else order[::-1]:
            results[name].append(run())
        print(f"round {r + 1}/{args.rounds} (load {loads[-1]:.1f}): " +
              ", ".join(f"{v[-1]:.1f}" for v in results.values()), flush=True)
    conn.send(None)
    child.join()
    med = {name: statistics.median(v) for name, v in results.items()}
    ours_med = med[ours_label]
    baseline = max(med[label] for label in plain)
    # per-round ratios against the best plain loop of that round: a load spike hits one round of all sides
    per_round = [results[ours_label][i] / max(results[label][i] for label in plain) for i in range(args.rounds)]
    cfg = recipe.model.model_config(num_classes=NUM_CLASSES[args.preset])
    what = Path(args.config).name if args.preset == "fmnist" else "ViT-S/16 preset"
    lines = [
        f"Training throughput, {what}: ViT D={cfg.embed_dim} L={cfg.depth} heads={cfg.num_heads} "
        f"MLP={cfg.mlp_dim}, {cfg.img_size}px / patch {cfg.patch_size} ({cfg.seq_len} tokens)"
        + (f" of a hybrid ResNet (stages {list(cfg.hybrid_layers)}, width {cfg.hybrid_width})"
           if cfg.hybrid_layers is not None else "") + f", batch {recipe.train.batch_size}, {args.threads} threads, "
        f"{args.rounds} interleaved rounds x {args.steps} steps. Host: {_cpu()}. Load average (1 min) before each "
        f"round: {', '.join(f'{x:.1f}' for x in loads)}; at the end {os.getloadavg()[0]:.1f}.",
        "",
        "| loop | median images/s | rounds |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {med[name]:.1f} | {', '.join(f'{v:.1f}' for v in vals)} |"
              for name, vals in results.items()]
    lines += ["", f"vitlab / best plain timm loop (eager, fp32 or bf16 autocast): {ours_med / baseline:.2f}x "
                  f"(medians); per round: {', '.join(f'{x:.2f}' for x in per_round)}"]
    if ours8:
        per8 = [results[int8_label][i] / max(results[label][i] for label in plain) for i in range(args.rounds)]
        pair = [results[int8_label][i] / results[ours_label][i] for i in range(args.rounds)]
        lines.append(f"vitlab int8 linears / best plain timm loop: {med[int8_label] / baseline:.2f}x (medians); per "
                     f"round: {', '.join(f'{x:.2f}' for x in per8)}; / vitlab without: "
                     f"{', '.join(f'{x:.2f}' for x in pair)}")
    if compiled:
        lines.append(f"vitlab / timm loop with bf16 autocast and torch.compile: {ours_med / med[compiled[0]]:.2f}x")
    if tuned:
        per = [results[ours_label][i] / results[tuned[0]][i] for i in range(args.rounds)]
        lines.append(f"vitlab / tuned timm loop (bf16, explicit attention, fused AdamW, torch.compile): "
                     f"{ours_med / med[tuned[0]]:.2f}x; per round: {', '.join(f'{x:.2f}' for x in per)}")
    text = "\n".join(lines)
    print(text)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps({
            "host": _cpu(), "loadavg_per_round": loads, "median": med, "rounds": results, "precision": chosen,
            "ratio": ours_med / baseline, "ratio_per_round": per_round,
            **({"ratio_int8": med[int8_label] / baseline, "ratio_int8_per_round": per8} if ours8 else {}),
            **({"ratio_vs_compiled": ours_med / med[compiled[0]]} if compiled else {}),
            **({"ratio_vs_tuned": ours_med / med[tuned[0]]} if tuned else {})}, indent=2))
    if root:
        shutil.rmtree(root, ignore_errors=True)


def _cpu() -> str:
    """The CPU and what decides bf16 speed on it (vitlab.perf.autotune's machine key)."""
    from vitlab.perf.autotune import machine_key

    return machine_key()


if __name__ == "__main__":
    main()
