"""How spread out each head's patch-to-patch attention is, per layer: normalised entropy, largest weight,
weight on itself, and the mean attention distance of foreground vs background query patches.

A diagnostic behind docs/analysis.md (why a small Fashion-MNIST ViT shows no local heads).

    .venv/bin/python benchmarks/analysis_attention_spread.py runs/analysis_fmnist_d6/model.safetensors
"""

from __future__ import annotations

import argparse
import math

import torch

import vitlab
from vitlab import data
from vitlab.analysis import iter_attention, patch_distances


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--images", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(2)
    model = vitlab.load_model(args.checkpoint).eval()
    cfg = model.cfg
    (gh, gw), P, prefix = cfg.grid_size, cfg.patch_size, cfg.num_prefix_tokens
    loader = data.build_eval_data(data.parse_data_spec("fashion_mnist"), "test", img_size=cfg.img_hw,
                                  in_chans=cfg.in_chans, batch_size=args.images)
    x = next(iter(loader))[0]
    B, N = len(x), gh * gw
    # a patch is foreground when any pixel is brighter than the background (-1 after inception scaling)
    fg = (x.reshape(B, -1, gh, P, gw, P).amax((1, 3, 5)) > -0.9).reshape(B, N)  # (B, N)
    dist = patch_distances((gh, gw), P).float()
    print("layer | entropy / log N per head | largest weight | weight on itself | distance: fg queries | bg queries")
    for i, attn in iter_attention(model, x):
        a = attn[:, :, prefix:, prefix:]
        a = a / a.sum(-1, keepdim=True)  # (B, H, N, N) over patch keys
        ent = -(a.clamp_min(1e-12).log() * a).sum(-1).mean((0, 2)) / math.log(N)
        top = a.amax(-1).mean((0, 2))
        own = torch.diagonal(a, dim1=-2, dim2=-1).mean((0, 2))
        md = (a * dist).sum(-1)  # (B, H, N)
        d_fg = (md * fg[:, None]).sum((0, 2)) / fg.sum()
        d_bg = (md * ~fg[:, None]).sum((0, 2)) / (~fg).sum()

        def f(t, k=2):
            return " ".join(f"{v:.{k}f}" for v in t.tolist())

        print(f"{i + 1} | {f(ent)} | {f(top)} | {f(own)} | {f(d_fg, 1)} | {f(d_bg, 1)}")
    print(f"uniform attention: entropy 1, largest weight = weight on itself = {1 / N:.3f}, "
          f"distance {dist.mean():.1f} px")


if __name__ == "__main__":
    main()
