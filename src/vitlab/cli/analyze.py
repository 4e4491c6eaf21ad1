"""`vitlab analyze CHECKPOINT --images PATH... | --data SPEC -o DIR`: the paper's figures for a checkpoint; thin over
`vitlab.analysis.inputs` and `vitlab.analysis.report`. `vitlab analyze --compare-families [MODEL...] -o PAGE.html`:
the ViT families' insides side by side (`vitlab.analysis.families`, `vitlab.analysis.familypage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..utils.progress import progress_bar
from ._common import UsageError, add_force, add_model_inputs, add_output, check_output, positive, want_progress

HELP = "the paper's figures for a checkpoint: filters, pos-emb similarity, attention"
DESCRIPTION = """\
Draw the paper's figures for a checkpoint (Sec. 4.5): the principal components of the patch-embedding filters
(Fig. 7 left), the similarity of the position embeddings (Fig. 7 centre), the mean attention distance per head and
layer (Fig. 7 right), and attention rollout maps (Fig. 6), on image files or the first images of a dataset. Each
figure is written as PNG with its numbers as JSON, plus report.html; the findings (does the model show what the
paper saw?) are printed. Register and distillation tokens are handled: the distance and rollout read the patch tokens
only, a DeiT model also gets its distillation token's rollout, and a "prefix tokens" figure shows per layer how the
class token's attention splits over class / distillation / registers / patches and the norms of each kind of token
(high-norm patch tokens are what registers absorb, Darcet et al. 2024).

With --compare-families, one HTML page compares the families (plain ViT, DeiT, DeiT-III, MAE, DINOv2 +- registers,
CLIP, SigLIP, EVA-02, DINOv3) built at random init at one small size, plus the checkpoints named after the option that
are already on this machine (paths, or registry / hf-hub names already cached: nothing is downloaded; the others are
listed as skipped): mean attention distance by depth, attention entropy per layer, position-embedding similarity,
register / patch norms. Their numbers go to a .json file beside the page. Checkpoints are fed --images / --data when
given, else standard-normal noise at their input size."""
EXAMPLES = """\
  vitlab analyze vit_b_16.IMAGENET1K_V1 --images cat.jpg photos/ -o report/
  vitlab analyze runs/fmnist/model.safetensors --data fashion_mnist --num-images 64 -o report/ --force
  vitlab analyze ViT-B_16.npz --images cat.jpg -o report-384/ --img-size 384 --layer-maps 1 -1
  vitlab analyze --compare-families -o families.html
  vitlab analyze --compare-families hf-hub:timm/vit_small_patch14_reg4_dinov2.lvd142m runs/x/model.safetensors \
      --images photos/ -o families.html"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?",
                   help="any checkpoint vitlab can load (ours, npz, timm, HF, torchvision, a name)")
    p.add_argument("--compare-families", nargs="*", metavar="MODEL", default=None,
                   help="one page comparing the families at random init, plus these checkpoints where cached")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--images", nargs="+", metavar="PATH", help="image files, or folders of them")
    src.add_argument("--data", metavar="SPEC", help="a dataset, e.g. fashion_mnist or imagefolder:/path")
    add_output(p, "folder for the PNG, JSON and HTML files (--compare-families: the HTML page's file)", required=True,
               metavar="DIR")
    add_force(p, "replace report files already in DIR")
    p.add_argument("--split", default="test", help="split of --data to take images from")
    p.add_argument("--num-images", type=int, default=32, help="images taken from --data")
    p.add_argument("--batch-size", type=int, default=16, help="images per forward pass; bounds memory")
    p.add_argument("--layer-maps", type=int, nargs="*", default=[], metavar="LAYER",
                   help="also draw every head's map of these layers (1-based; -1 is the last)")
    p.add_argument("--components", type=int, default=28, help="principal components of E to show")
    add_model_inputs(p, "input size (default: the model's); learned position embeddings are resampled")


def run(args: argparse.Namespace) -> int:
    if args.compare_families is not None:
        if args.checkpoint is not None:
            raise UsageError(f"--compare-families takes its models after it, not {args.checkpoint!r} before")
        return _compare(args)
    if args.checkpoint is None or (args.images is None and args.data is None):
        raise UsageError("give a CHECKPOINT and --images PATH... or --data SPEC (or --compare-families)")
    import torch

    from ..analysis.inputs import analysis_preprocess, check_image_size, load_checkpoint, load_inputs
    from ..analysis.report import analyze, write_report
    from ._common import preprocess_overrides
    positive("--batch-size", args.batch_size)
    positive("--components", args.components)
    positive("--num-images", args.num_images)
    check_output(args.output, folder=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    with progress_bar(total=4, desc="analyze", unit="step", enabled=want_progress(args)) as bar:
        bar.set_postfix_str("loading the checkpoint")
        model = load_checkpoint(args.checkpoint, device)
        depth = len(model.blocks)
        layers = []
        for layer in args.layer_maps:
            if layer == 0 or not -depth <= layer <= depth:
                raise UsageError(f"--layer-maps {layer} is not a layer of this {depth}-layer model (1..{depth}, "
                                 f"or -1 for the last)")
            layers.append(layer - 1 if layer > 0 else layer)
        bar.update()
        bar.set_postfix_str("reading images")
        size = check_image_size(model, args.img_size)
        pre = analysis_preprocess(model, args.checkpoint, size, preprocess=preprocess_overrides(args))
        images = load_inputs(model, pre, images=args.images, data=args.data, split=args.split,
                             num_images=args.num_images)
        bar.update()
        bar.set_postfix_str(f"attention over {len(images)} images")
        result = analyze(model, images, batch_size=args.batch_size, layer_maps=layers,
                         num_components=args.components, source=str(args.checkpoint))
        bar.update()
        bar.set_postfix_str("writing the report")
        files = write_report(result, args.output, overwrite=args.force)
        bar.update()
    for name, f in result.findings.items():
        print(f"{name}: {'yes' if f['yes'] else 'no'}")
    print(f"wrote {len(files)} files to {args.output} (open {Path(args.output) / 'report.html'})")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """`--compare-families`: measure the random-init families and the cached checkpoints, write the page and JSON."""
    import json

    from ..analysis.families import cached_models, measure, noise_images, random_init_families
    from ..analysis.familypage import families_page
    from ..analysis.inputs import analysis_preprocess, load_inputs
    from ..utils.io import write_atomic
    positive("--num-images", args.num_images)
    page = Path(args.output)
    if page.suffix.lower() != ".html":
        page = page / "families.html"
    numbers = page.with_suffix(".json")
    check_output(page.parent, folder=True)
    if not args.force and (page.exists() or numbers.exists()):
        raise FileExistsError(f"{page} or {numbers.name} exists; pass --force to replace them")
    results = random_init_families(num_images=min(args.num_images, 8))
    models, skipped = cached_models(args.compare_families)
    for name, model in models.items():
        if args.images is None and args.data is None:
            images = noise_images(model.cfg, min(args.num_images, 8))
        else:
            pre = analysis_preprocess(model, name, model.cfg.img_hw)
            images = load_inputs(model, pre, images=args.images, data=args.data, split=args.split,
                                 num_images=args.num_images)
        results.append(measure(model, images, name, source=name, batch_size=args.batch_size))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    write_atomic(numbers, json.dumps({"models": [r.to_dict() for r in results], "skipped": skipped}).encode(),
                 overwrite=True)
    write_atomic(page, families_page(results, skipped, numbers=numbers.name).encode(), overwrite=True)
    print(f"wrote {page} ({len(results) - len(models)} random-init families and {len(models)} of "
          f"{len(args.compare_families)} checkpoints; numbers in {numbers.name})")
    return 0
