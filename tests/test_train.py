"""Recipes, optimizer groups, schedule, and one real training step per shipped config (tiny sizes)."""

from __future__ import annotations

import glob
import math
import os
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.train import load_recipe, lr_at, param_groups, train
from vitlab.train.recipe import Recipe, ScheduleSection, apply_overrides, parse_override, read_recipe_dict

from .conftest import perturb_, skip_if_emulated

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(glob.glob(str(ROOT / "configs" / "*.yaml")))
TINY = {"embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}


def test_configs_exist():
    names = {Path(c).name for c in CONFIGS}
    for required in ("vit_b16_i21k_pretrain.yaml", "vit_b16_finetune_imagenet.yaml", "vit_b16_finetune_cifar10.yaml",
                     "vit_b16_finetune_cifar100.yaml", "vit_s16_i1k_plain.yaml", "fmnist_pretrain.yaml",
                     "fmnist_finetune.yaml", "fmnist_scratch.yaml"):
        assert required in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: Path(p).name)
def test_every_config_parses_and_says_command_cost_result(path):
    recipe = load_recipe(path)
    header = Path(path).read_text().split("\n\n")[0]
    for word in ("Command:", "Cost:", "Expect"):
        assert word in header, f"{path} header lacks {word}"
    # round trip: what a run writes to recipe.yaml reads back to the same recipe
    assert Recipe.from_dict(recipe.to_dict()).to_dict() == recipe.to_dict()


def test_paper_recipes_hold_the_papers_numbers():
    pre = load_recipe(ROOT / "configs/vit_b16_i21k_pretrain.yaml")
    assert (pre.optim.name, pre.optim.betas, pre.train.batch_size) == ("adamw", (0.9, 0.999), 4096)
    assert (pre.schedule.name, pre.schedule.warmup_steps) == ("linear", 10000)
    assert pre.model.overrides["representation_size"] == 768 and pre.train.accum_steps > 1
    for ds in ("imagenet", "cifar10", "cifar100"):
        ft = load_recipe(ROOT / f"configs/vit_b16_finetune_{ds}.yaml")
        assert (ft.optim.name, ft.optim.momentum, ft.optim.weight_decay, ft.optim.clip_grad_norm) == ("sgd", 0.9, 0, 1)
        assert (ft.train.batch_size, ft.schedule.warmup_steps, ft.schedule.name) == (512, 500, "cosine")
        assert ft.model.overrides["img_size"] == 384 and ft.init.drop_head
    plain = load_recipe(ROOT / "configs/vit_s16_i1k_plain.yaml")
    cfg = plain.model.vit_config()
    assert (cfg.pool, cfg.class_token, cfg.pos_embed, cfg.embed_dim) == ("gap", False, "sincos2d", 384)
    assert (plain.data["randaugment"], plain.train.mixup, plain.train.batch_size) == ("2-10", 0.2, 1024)


@pytest.mark.parametrize(("text", "error"), [
    ("train:\n  steps: 3\n  batch_sise: 8\n", r"batch_sise.*valid keys.*batch_size"),
    ("trian:\n  steps: 3\n", r"trian.*valid sections"),
    ("model:\n  name: ViT-B/16\n  widht: 3\ntrain:\n  steps: 3\n", r"widht.*valid fields"),
    ("data:\n  datset: fashion_mnist\ntrain:\n  steps: 3\n", r"datset"),
    ("train:\n  steps: 3\n  precision: fp16\n", r"train.precision must be one of"),
])
def test_unknown_keys_list_the_valid_ones(tmp_path, text, error):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_recipe(bad)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_recipe(tmp_path / "missing.yaml")


def test_auto_precision_is_bf16_only_where_it_is_fast(tmp_path, monkeypatch):
    from vitlab.perf import cpu, precision

    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\nbugs\t\t: amx_bf16_not_a_flag\n")
    assert cpu.cpu_has_amx(str(amx)) and not cpu.cpu_has_amx(str(plain))
    assert not cpu.cpu_has_amx(str(tmp_path / "missing"))  # not Linux: no cpuinfo, so fp32
    for var in cpu.EMULATION_VARS:  # a plain host (under kernel emulation the rule is fp32: test_precision.py)
        monkeypatch.delenv(var, raising=False)
    for has_amx, expect in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(cpu, "cpu_has_amx", lambda has_amx=has_amx: has_amx)
        assert precision.resolve_precision("auto", "cpu") == expect
        assert precision.resolve_precision("fp32", "cpu") == "fp32"
        assert precision.resolve_precision("bf16", "cpu") == "bf16"
        with precision.autocast(torch.device("cpu"), "auto"):
            assert torch.is_autocast_enabled("cpu") is has_amx
    (tmp_path / "r.yaml").write_text("train:\n  steps: 3\n  precision: auto\n")
    assert load_recipe(tmp_path / "r.yaml").train.precision == "auto"
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        precision.resolve_precision("fp16", "cpu")


def test_precision_default_is_auto_everywhere(tmp_path, synthetic_data):
    """`auto` is the default of the recipe's train section, `train_step`, `evaluate`, `evaluate_checkpoint` and
    the eval command (issue 17); a `Recipe` without a train section gets it too, and `train` records what it
    resolved to."""
    import argparse
    import inspect

    from vitlab.cli.eval import add_arguments
    from vitlab.inference.evaluate import evaluate, evaluate_checkpoint
    from vitlab.perf.precision import resolve_precision
    from vitlab.train import train_step
    from vitlab.train.recipe import TrainSection

    assert TrainSection().precision == "auto" and Recipe().train.precision == "auto"
    assert Recipe.from_dict({"train": {"steps": 1}}).train.precision == "auto"
    for fn in (train_step, evaluate, evaluate_checkpoint):
        assert inspect.signature(fn).parameters["precision"].default == "auto", fn.__name__
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["m.safetensors", "--data", "fashion_mnist"]).precision == "auto"
    r = Recipe.from_dict({"model": {**TINY, "img_size": 28, "patch_size": 7, "in_chans": 1}, "data": synthetic_data,
                          "train": {"batch_size": 8, "steps": 1,
                                    "evaluators": {"eval": {"type": "classification", "max_samples": 16}}}})
    assert train(r, tmp_path / "run", progress=False).precision == resolve_precision("auto", "cpu")


def test_set_overrides_parse_yaml_values():
    assert parse_override("optim.lr=3e-4") == (["optim", "lr"], 3e-4)
    assert parse_override("optim.betas=[0.9, 0.95]") == (["optim", "betas"], [0.9, 0.95])
    assert parse_override("init.checkpoint=null") == (["init", "checkpoint"], None)
    d = apply_overrides({"train": {"steps": 5}}, ["train.steps=7", "model.img_size=56"])
    assert d == {"train": {"steps": 7}, "model": {"img_size": 56}}
    with pytest.raises(ValueError, match=r"section\.key=value"):
        parse_override("steps")
    with pytest.raises(ValueError, match="unknown section"):
        parse_override("optimizer.lr=1")


def test_yaml_scientific_notation_is_a_number(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("optim:\n  lr: 3e-4\ntrain:\n  steps: 2\n")  # PyYAML alone reads "3e-4" as a string
    assert read_recipe_dict(p)["optim"]["lr"] == 3e-4


def test_weight_decay_only_on_matrices_not_pos_embed_or_cls():
    model = vitlab.create_model("ViT-Ti/16", depth=2, img_size=32, num_classes=3)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    expected = {n for n, p in model.named_parameters() if p.ndim >= 2 and n not in ("pos_embed", "cls_token")}
    assert decayed == expected
    assert "blocks.0.attn.qkv.weight" in decayed and "patch_embed.proj.weight" in decayed
    assert not decayed & {"pos_embed", "cls_token", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias"}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedule_matches_torch_schedulers():
    # warm-up: linear to the peak; then cosine equals torch's CosineAnnealingLR, linear equals LinearLR
    total, warm, peak = 50, 10, 0.5
    cos = ScheduleSection(name="cosine", warmup_steps=warm, end_lr=0.01)
    assert [lr_at(s, total, peak, cos) for s in range(warm)] == pytest.approx([peak * (s + 1) / warm
                                                                               for s in range(warm)])
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warm, eta_min=0.01)
    ref = []
    for _ in range(total - warm):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert [lr_at(s, total, peak, cos) for s in range(warm, total)] == pytest.approx(ref)
    lin = ScheduleSection(name="linear", warmup_steps=warm, end_lr=0.0)
    assert lr_at(warm, total, peak, lin) == pytest.approx(peak)
    assert lr_at(warm + 20, total, peak, lin) == pytest.approx(peak * (1 - 20 / 40))
    assert lr_at(total - 1, total, peak, ScheduleSection(name="constant")) == peak


# -- one real training step per shipped config -------------------------------------------------------------

# Data keys that point at files we do not have; everything else (augmentation, normalisation) is kept.
_LOCATION_KEYS = ("dataset", "root", "test_root", "train_subdir", "test_subdir", "num_workers", "shuffle_buffer",
                  "num_samples", "num_classes", "class_names", "val_fraction")


def _tiny(path: str, tmp_path: Path, source: dict) -> Recipe:
    d = read_recipe_dict(path)
    model = d.setdefault("model", {})
    big_res = model.get("img_size", 224) > 224
    in_chans = model.get("in_chans", 3)
    # a hybrid keeps its patch size (1x1 patches of the ResNet map, whose stride divides 32); others use 8 px
    hybrid = model.get("hybrid_layers") is not None
    if str(model.get("name", "")).startswith("BiT-"):  # the paper's CNN baseline: a narrow one, its own stages
        model.update(img_size=32, width=32)
    elif model.get("name") == "init.checkpoint":  # the architecture of the checkpoint (a DINOv2-style backbone)
        model.update(img_size=32)
        backbone = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, in_chans=in_chans,
                                       num_classes=0, layer_scale=1e-5, reg_tokens=4, no_embed_class=True)
        vitlab.save_weights(perturb_(backbone), tmp_path / "backbone.safetensors")
        d["init"]["checkpoint"] = str(tmp_path / "backbone.safetensors")
    else:
        model.update(TINY, img_size=48 if big_res else 32, patch_size=model.get("patch_size", 1) if hybrid else 8)
    if model.get("representation_size"):
        model["representation_size"] = TINY["embed_dim"]
    if d.get("distill"):  # a tiny teacher of the student's input (the synthetic data: 10 classes)
        teacher = vitlab.create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, in_chans=in_chans, num_classes=10)
        vitlab.save_weights(perturb_(teacher), tmp_path / "teacher.safetensors")
        d["distill"]["teacher"] = str(tmp_path / "teacher.safetensors")
    data = {k: v for k, v in (d.get("data") or {}).items() if k not in _LOCATION_KEYS}
    data.update(**source, expand_channels=in_chans == 3)
    d["data"] = data
    tr = d.setdefault("train", {})
    accum = tr.get("accum_steps", 1)
    # bf16 kept for one recipe (it is slow on CPUs without AMX); the rest run in fp32
    precision = "bf16" if Path(path).name == "vit_s16_i1k_plain.yaml" else "fp32"
    tr.update(batch_size=2 * accum, steps=1, epochs=None, checkpoint_every=0, compile=False, precision=precision)
    tr["evaluators"]["eval"].update(every=0, batch_size=250, max_samples=500, split="test")
    if (d.get("init") or {}).get("checkpoint") and model.get("name") != "init.checkpoint":
        # a tiny pre-trained model at a lower resolution, with a pre-logits layer and another head
        # (the recipe's own architecture: a hybrid's stem, pooling and class token; 24 px = a 3x3 grid for a hybrid)
        arch = {k: v for k, v in model.items() if k not in ("name", "img_size", "num_classes")}
        pre = vitlab.create_model(model["name"], **{**arch, "img_size": 24 if hybrid else 32,
                                                    "patch_size": model["patch_size"], "in_chans": in_chans,
                                                    "num_classes": 7, "representation_size": TINY["embed_dim"]})
        ckpt = tmp_path / "pre.safetensors"
        vitlab.save_weights(pre, ckpt)
        d["init"]["checkpoint"] = str(ckpt)
    return Recipe.from_dict(d)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: Path(p).name)
def test_one_training_step_per_config(path, tmp_path, synthetic_data):
    recipe = _tiny(path, tmp_path, synthetic_data)
    summary = train(recipe, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["step"] == 1
    assert math.isfinite(summary["eval"]["loss"]) and summary["eval"]["num_samples"] == 500
    if recipe.train.linear_probe:  # a linear classifier on DINOv2's probe features [class; mean patch]: (K, 2D)
        from safetensors.torch import load_file

        head = load_file(summary["model"])
        assert head["weight"].shape == (10, 2 * TINY["embed_dim"])
        return
    model = vitlab.load_model(summary["model"])
    assert model.cfg.img_size == recipe.model.overrides["img_size"]
    meta = vitlab.weights.read_metadata(summary["model"])
    assert meta["classes"][0] == "pattern 0" and meta["recipe"]["train"]["steps"] == 1
    for f in ("report.md", "report.json", "curves.png", "metrics.jsonl", "recipe.yaml"):
        assert (tmp_path / "run" / f).is_file()
    assert os.listdir(tmp_path / "run" / "tb")


def test_finetune_resamples_pos_embed_and_zeroes_head(tmp_path):
    pre = vitlab.create_model("ViT-Ti/16", **TINY, img_size=28, patch_size=4, in_chans=1, num_classes=10)
    torch.nn.init.normal_(pre.head.weight)
    ckpt = tmp_path / "pre.safetensors"
    vitlab.save_weights(pre, ckpt)
    sets = [f"init.checkpoint={ckpt}", "data.dataset=synthetic", *(f"model.{k}={v}" for k, v in TINY.items())]
    from vitlab.train import build_model

    # The shipped demo fine-tune keeps the pre-trained head (same 10 classes) ...
    kept = build_model(load_recipe(ROOT / "configs/fmnist_finetune.yaml", sets), num_classes=10)
    torch.testing.assert_close(kept.head.weight, pre.head.weight)
    # ... and the paper's recipe (a new label set) drops it for a zero-initialised one (Sec. 3.2).
    r = load_recipe(ROOT / "configs/fmnist_finetune.yaml", [*sets, "init.drop_head=true"])
    model = build_model(r, num_classes=10)
    assert model.cfg.img_size != 28
    assert torch.count_nonzero(model.head.weight) == 0
    from vitlab.models.posembed import resample_pos_embed

    expected = resample_pos_embed(pre.pos_embed.detach(), model.cfg.grid_size, pre.cfg.grid_size, 1,
                                  r.init.pos_embed_resize)
    torch.testing.assert_close(model.pos_embed.detach(), expected)
    torch.testing.assert_close(model.blocks[0].mlp.fc1.weight, pre.blocks[0].mlp.fc1.weight)


@skip_if_emulated
def test_compiled_bf16_steps_match_eager(tmp_path, synthetic_data):
    """The shipped Fashion-MNIST recipe trains under torch.compile with bf16 autocast (where the CPU has AMX): three
    compiled steps of its (tiny) model must follow the eager fp32 steps to bf16 precision."""
    import copy

    from vitlab.train.loop import build_model, train_step
    from vitlab.train.optim import build_optimizer

    recipe = _tiny(str(Path(vitlab.__file__).parents[2] / "configs" / "fmnist_hybrid.yaml"), tmp_path, synthetic_data)
    torch.manual_seed(0)
    eager = build_model(recipe, num_classes=10)
    compiled = copy.deepcopy(eager)
    opt_e, opt_c = build_optimizer(eager, recipe.optim), build_optimizer(compiled, recipe.optim)
    net = torch.compile(compiled)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 1, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    torch.nn.functional.cross_entropy(eager(x), y).backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = net(x)
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    ge = torch.cat([p.grad.flatten() for p in eager.parameters()])
    gc = torch.cat([p.grad.flatten() for p in compiled.parameters()])
    assert torch.linalg.vector_norm(gc - ge) <= 0.05 * torch.linalg.vector_norm(ge)  # the whole gradient
    kw = dict(lr=1e-3, device=torch.device("cpu"), clip_grad_norm=1.0, label_smoothing=0.1)
    opt_e.zero_grad(set_to_none=True)
    opt_c.zero_grad(set_to_none=True)
    for _ in range(3):
        batch = [(torch.randn(8, 1, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))]
        a = train_step(eager, opt_e, batch, precision="fp32", **kw)
        b = train_step(net, opt_c, batch, precision="bf16", **kw)
        assert b.applied and abs(a.loss - b.loss) <= 0.02 * a.loss
