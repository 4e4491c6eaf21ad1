"""Training throughput on the Fashion-MNIST recipe: vitlab's trainer against a plain timm ViT of the same shape in
a standard PyTorch loop (torchvision FashionMNIST + per-image transforms + DataLoader, AdamW). For a hybrid
recipe (the default, configs/fmnist_hybrid.yaml) timm's side is its ResNetV2 + HybridEmbed; "same shape" is
checked by loading timm's state dict into vitlab's model with strict=True.

Each loop runs in its own process, as a user would run it (ours with vitlab's allocator setting, see
src/vitlab/allocator.py; the baseline with the default one), and the rounds are interleaved (A, B, A, B, ...)
so that a machine shared with other jobs slows both alike; only one side computes at a time. The table reports
the median images/s of each side. The baseline is run in fp32 and with bf16 autocast (what a user adds on a CPU
with AMX), each with the DataLoader in-process (num_workers=0) and with worker processes; the fastest of these
plain loops is the baseline of the ratio. A fifth row, timm with bf16 autocast under torch.compile, is a stronger
reference than the target asks for and gets its own ratio line.

    .venv/bin/python benchmarks/train_throughput.py --rounds 5 --steps 10 -o benchmarks/results/train_throughput.md
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

from vitlab.precision import resolve_precision
from vitlab.train import load_recipe
from vitlab.train.loop import build_model, train_step
from vitlab.train.mixup import BatchMix
from vitlab.train.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
FMNIST = "/usr/share/datasets/fashion-mnist"


def vitlab_side(recipe, steps_per_round: int):
    """A closure running `steps_per_round` steps of vitlab's own loop (stream + train_step), returning images/s."""
    from vitlab.data import DataConfig, build_train_stream

    cfg = recipe.model.vit_config(num_classes=10)
    stream = build_train_stream(DataConfig.from_dict(recipe.data), img_size=cfg.img_size, in_chans=cfg.in_chans,
                                batch_size=recipe.train.batch_size, seed=0)
    model = build_model(recipe, num_classes=10)
    opt = build_optimizer(model, recipe.optim)
    net = torch.compile(model) if recipe.train.compile else model
    mix = BatchMix(10, recipe.train.mixup, recipe.train.cutmix)
    dev = torch.device("cpu")

    def run() -> float:
        t = time.perf_counter()
        for _ in range(steps_per_round):
            train_step(net, opt, [next(stream)], lr=recipe.optim.lr, device=dev, precision=recipe.train.precision,
                       clip_grad_norm=recipe.optim.clip_grad_norm, label_smoothing=recipe.train.label_smoothing,
                       mix=mix)
        return steps_per_round * recipe.train.batch_size / (time.perf_counter() - t)

    return run


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


def timm_model(cfg) -> torch.nn.Module:
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
        img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=10,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        global_pool="avg" if cfg.pool == "gap" else "token", class_token=cfg.class_token,
        fc_norm=False,  # LayerNorm on every token, then the pooling: vitlab's (and big_vision's) order
        pos_embed="learn" if cfg.pos_embed == "learned" else "none", **extra)
    # same shape means same parameter names and shapes: vitlab's model takes timm's weights as they are
    from vitlab.model import VisionTransformer

    VisionTransformer(cfg).load_state_dict(model.state_dict(), strict=True)
    return model


def timm_side(recipe, steps_per_round: int, num_workers: int, root: str, precision: str = "fp32",
              compile: bool = False):
    """The standard loop: timm VisionTransformer, torchvision dataset + v2 transforms, DataLoader, AdamW; fp32, or
    bf16 autocast (weights fp32) as a user would add it; optionally torch.compile'd (not a plain loop any more)."""
    import torchvision
    import torchvision.transforms.v2 as T

    cfg = recipe.model.vit_config(num_classes=10)
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
    model = timm_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.optim.lr, weight_decay=recipe.optim.weight_decay)
    net = torch.compile(model) if compile else model
    it = iter(loader)

    def run() -> float:
        nonlocal it
        model.train()
        t = time.perf_counter()
        for _ in range(steps_per_round):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
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


def baseline_variants(workers: int) -> list[tuple[str, int, str, bool]]:
    """(row label, DataLoader workers, precision, torch.compile) of each baseline loop. The eager rows are the
    plain loop the target is set against; the compiled row is a stronger reference, reported beside it."""
    rows = []
    for precision, what in (("fp32", "fp32"), ("bf16", "bf16 autocast")):
        for w in (0, workers):
            rows.append((f"timm + torchvision DataLoader ({what}, num_workers={w})", w, precision, False))
    rows.append((f"timm + torchvision DataLoader (bf16 autocast, torch.compile, num_workers={workers})", workers,
                 "bf16", True))
    return rows


def _baseline_process(conn, config: str, overrides: list[str], steps: int, workers: int, threads: int,
                      root: str) -> None:
    """The baselines' own process: build both loops, then run a round whenever the parent asks for one."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    recipe = load_recipe(config, overrides)
    sides = [timm_side(recipe, steps, w, root, precision, compiled) for _, w, precision, compiled in
             baseline_variants(workers)]
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        conn.send(sides[msg]())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "fmnist_hybrid.yaml"))
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of the baseline's second variant")
    p.add_argument("-o", "--output", default=None, help="write the table (Markdown) and a .json beside it")
    args = p.parse_args()
    import multiprocessing as mp

    from vitlab.allocator import keep_freed_memory

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    recipe = load_recipe(args.config, args.overrides)
    root = torchvision_root()
    conn, child_conn = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=_baseline_process, args=(
        child_conn, args.config, args.overrides, args.steps, args.workers, args.threads, root))
    child.start()
    if conn.recv() != "ready":
        raise RuntimeError("the baseline process did not start")

    def remote(key: int):
        def run() -> float:
            conn.send(key)
            return conn.recv()
        return run

    allocator = "tuned allocator" if keep_freed_memory() else "default allocator"
    compile_note = ", torch.compile" if recipe.train.compile else ""
    variants = baseline_variants(args.workers)
    sides = {
        f"vitlab ({resolve_precision(recipe.train.precision, 'cpu')}{compile_note}, in-memory batch "
        f"augmentation, {allocator})": vitlab_side(recipe, args.steps),
        **{label: remote(i) for i, (label, *_) in enumerate(variants)},
    }
    plain = [label for label, _, _, c in variants if not c]
    compiled = [label for label, _, _, c in variants if c]
    for run in sides.values():  # warm-up round, not counted
        run()
    results: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name, run in sides.items():
            results[name].append(run())
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{v[-1]:.0f}" for v in results.values()), flush=True)
    conn.send(None)
    child.join()
    med = {name: statistics.median(v) for name, v in results.items()}
    ours = next(iter(med.values()))
    baseline = max(med[label] for label in plain)
    strongest = max(med[label] for label in compiled)
    cfg = recipe.model.vit_config(num_classes=10)
    lines = [
        f"Training throughput, {Path(args.config).name}: ViT D={cfg.embed_dim} L={cfg.depth} heads={cfg.num_heads} "
        f"MLP={cfg.mlp_dim}, {cfg.img_size}px / patch {cfg.patch_size} ({cfg.seq_len} tokens)"
        + (f" of a hybrid ResNet (stages {list(cfg.hybrid_layers)}, width {cfg.hybrid_width})"
           if cfg.hybrid_layers is not None else "") + ", batch "
        f"{recipe.train.batch_size}, {args.threads} threads, {args.rounds} interleaved rounds x {args.steps} steps, "
        f"load average at the end {os.getloadavg()[0]:.1f}",
        "",
        "| loop | median images/s | rounds |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {med[name]:.0f} | {', '.join(f'{v:.0f}' for v in vals)} |"
              for name, vals in results.items()]
    lines += ["", f"vitlab / best plain timm loop (eager, fp32 or bf16 autocast): {ours / baseline:.2f}x",
              f"vitlab / timm loop with bf16 autocast and torch.compile: {ours / strongest:.2f}x"]
    text = "\n".join(lines)
    print(text)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps({"median": med, "rounds": results,
                                                        "ratio": ours / baseline,
                                                        "ratio_vs_compiled": ours / strongest}, indent=2))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
