"""A small ViT trained on Fashion-MNIST with a minimal loop, for `vitlab analyze` when no trainer run exists.

Not the project's trainer (that is `vitlab train`): only enough to give the analysis a model whose figures
can be compared with the paper's. AdamW, linear warm-up then cosine decay, random crops (pad 2) and flips.

    .venv/bin/python benchmarks/analysis_train_fmnist.py --epochs 5 -o runs/analysis_fmnist/model.safetensors
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

import vitlab
from vitlab import data


def load_split(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    loader = data.build_eval_data(data.parse_data_spec("fashion_mnist"), split, img_size=28, in_chans=1,
                                  batch_size=10_000)
    xs, ys = zip(*[(b[0], b[1]) for b in loader])
    return torch.cat(xs), torch.cat(ys)  # (n, 1, 28, 28) in [-1, 1], (n,)


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random 28x28 crops of the 2-pixel zero-padded (background) image, and horizontal flips."""
    B = x.shape[0]
    pad = F.pad(x, (2, 2, 2, 2), value=-1.0)  # background is -1 after inception normalisation
    dy, dx = torch.randint(0, 5, (2,), generator=g).tolist()  # one shift per batch: cheap
    x = pad[:, :, dy : dy + 28, dx : dx + 28]
    flip = torch.rand(B, generator=g) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor, bs: int = 1000) -> float:
    model.eval()
    correct = sum((model(x[i : i + bs]).argmax(1) == y[i : i + bs]).sum().item() for i in range(0, len(x), bs))
    model.train()
    return correct / len(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    tx, ty = load_split("train")
    ex, ey = load_split("test")
    model = vitlab.create_model("ViT-Ti/16", img_size=28, patch_size=args.patch, in_chans=1, num_classes=10,
                                embed_dim=args.dim, depth=args.depth, num_heads=args.heads, mlp_dim=2 * args.dim)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n not in model.no_weight_decay()]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and n not in model.no_weight_decay())]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": rest,
                                                                                    "weight_decay": 0.0}], lr=args.lr)
    steps_per_epoch = len(tx) // args.batch_size
    total = int(args.epochs * steps_per_epoch)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr * 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, total - args.warmup)))

    model.train()
    t0, step = time.perf_counter(), 0
    while step < total:
        perm = torch.randperm(len(tx), generator=g)
        for i in range(steps_per_epoch):
            if step >= total:
                break
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = F.cross_entropy(model(augment(tx[idx], g)), ty[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 100 == 0 or step == total:
                print(f"step {step}/{total} loss {loss.item():.3f} lr {lr_at(step):.2e} "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
    acc = accuracy(model, ex, ey)
    minutes = (time.perf_counter() - t0) / 60
    print(f"test accuracy {100 * acc:.2f}% after {total} steps ({minutes:.1f} min)")
    meta = {"recipe": {"data": {"dataset": "fashion_mnist", "normalize": "inception"}, "script": __file__,
                       "args": vars(args)}, "test_top1": acc, "steps": total, "train_minutes": minutes}
    vitlab.save_weights(model, args.output, metadata=meta)
    print(json.dumps({"checkpoint": args.output, "test_top1": acc}))


if __name__ == "__main__":
    main()
