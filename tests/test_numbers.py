"""Numbers that cannot train a model never reach the weights: every number of a recipe, DataConfig and ViTConfig
is finite and in range, an update that overflows the weights stops the run with nothing non-finite written, no
checkpoint or final model with inf / nan is ever saved, and inputs the model cannot take are refused in our words.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import vitlab
from vitlab.cli import main
from vitlab.data import DataConfig
from vitlab.models.config import ViTConfig, check_number
from vitlab.train import NonFiniteError, Recipe, list_checkpoints, train, train_step
from vitlab.train import run as run_mod
from vitlab.train.evalconfig import ClassificationEvaluator, EarlyStopEvaluator, FewShotEvaluator
from vitlab.train.recipe import OptimSection, ScheduleSection, TrainSection, load_recipe
from vitlab.train.step import StepResult, all_finite

ROOT = Path(__file__).resolve().parents[1]
TINY = {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
        "patch_size": 7, "in_chans": 1}
NON_FINITE = (float("inf"), float("-inf"), float("nan"))


def tiny_recipe(optim: dict, **train_kw) -> Recipe:
    return Recipe.from_dict({
        "model": TINY, "data": {"dataset": "synthetic", "inception_crop": False}, "optim": optim,
        "train": {"batch_size": 16, "steps": 6, "precision": "fp32", "log_every": 1,
                  "evaluators": {"eval": {"type": "classification", "batch_size": 250, "max_samples": 250}},
                  **train_kw}})


def finite_file(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(str(path)).values() if t.is_floating_point())


# -- every number validated ------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, field", [
    ("optim.lr=1e400", "optim.lr"),  # YAML reads 1e400 as inf
    ("optim.weight_decay=.inf", "optim.weight_decay"),
    ("schedule.end_lr=.nan", "schedule.end_lr"),
    ("train.epochs=.inf", "train.epochs"),
])
def test_recipe_refuses_the_non_finite_numbers_of_the_issue(tmp_path, override, field):
    path = tmp_path / "r.yaml"
    path.write_text("model: {name: Ti/16}\ndata: {dataset: synthetic}\ntrain: {steps: 2}\n")
    extra = ["train.steps=null"] if field == "train.epochs" else []
    with pytest.raises(ValueError, match=rf"{re.escape(field)} must be a finite number, got (inf|nan)"):
        load_recipe(path, [override, *extra])
    # the same numbers written in the file itself
    section, key = field.split(".")
    value = override.split("=", 1)[1]
    steps = "epochs: 1" if field == "train.epochs" else "steps: 2"
    body = (f"train: {{{key}: {value}}}\n" if section == "train"
            else f"{section}: {{{key}: {value}}}\ntrain: {{{steps}}}\n")
    path.write_text(f"model: {{name: Ti/16}}\ndata: {{dataset: synthetic}}\n{body}")
    with pytest.raises(ValueError, match=rf"{re.escape(field)} must be"):
        load_recipe(path)


def _number_fields(cls: type) -> list[tuple[str, object]]:
    """(name, default) of the fields of a config dataclass whose annotation is a number or a pair of numbers."""
    out = []
    for f in dataclasses.fields(cls):
        ann = str(f.type)
        if ("int" in ann or "float" in ann) and "list" not in ann and f.name != "img_size":
            out.append((f.name, f.default))
    return out


def _sections() -> list[tuple[str, type, dict]]:
    return [("optim", OptimSection, {}), ("schedule", ScheduleSection, {}),
            ("train", TrainSection, {"steps": None, "epochs": 1.0}),
            ("train.evaluators.eval", ClassificationEvaluator, {}),
            ("train.evaluators.early_stop", EarlyStopEvaluator, {"every": 1}),
            ("train.evaluators.fewshot", FewShotEvaluator, {}), ("data", DataConfig, {"dataset": "synthetic"}),
            ("ViTConfig", ViTConfig, dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                                          patch_size=7, hybrid_width=64))]


@pytest.mark.parametrize("where, cls, base", _sections(), ids=[s[0] for s in _sections()])
def test_every_number_field_refuses_inf_and_nan_naming_the_field(where, cls, base):
    fields = _number_fields(cls)
    assert len(fields) >= 2  # the annotation filter found the fields
    for name, default in fields:
        for bad in NON_FINITE:
            value = (bad, bad) if isinstance(default, tuple) else bad
            kw = {**base, name: value}
            if name == "hybrid_width":
                kw["hybrid_layers"] = ()
            if name == "steps":
                kw["epochs"] = None
            with pytest.raises(ValueError, match=rf"{re.escape(where)}\.{name}(\[0\])? must be"):
                obj = cls(**kw)  # DataConfig and ViTConfig validate on construction, the recipe sections on demand
                if cls in (ClassificationEvaluator, EarlyStopEvaluator, FewShotEvaluator):
                    obj.validate(where)
                elif cls not in (DataConfig, ViTConfig):
                    obj.validate()


def test_check_number_is_one_rule():
    check_number("x", 3, integer=True, lo=1)
    check_number("x", 0.5, lo=0, hi=1, hi_open=True)
    for bad, kw in [(True, {}), (1.5, {"integer": True}), (np.int64(3), {"integer": True}), ("1", {}),
                    (None, {}), (0, {"lo": 0, "lo_open": True}), (1.0, {"hi": 1, "hi_open": True})]:
        with pytest.raises(ValueError, match="x must be"):
            check_number("x", bad, **kw)
    with pytest.raises(ValueError, match=r"optim\.betas\[1\] must be < 1"):  # beta2 = 1 divides by zero in Adam
        OptimSection(betas=(0.9, 1.0)).validate()


# -- ViTConfig: what it accepted but could not build or run ---------------------------------------------------

@pytest.mark.parametrize("kw, field", [
    (dict(class_token=1), "class_token"),  # a truthy int silently meant True
    (dict(qkv_bias="no"), "qkv_bias"),  # a truthy string silently meant True
    (dict(layer_norm_eps=float("nan")), "layer_norm_eps"),  # every output nan
    (dict(layer_norm_eps=float("inf")), "layer_norm_eps"),  # every LayerNorm output zero
    (dict(dropout=False), "dropout"),  # bools are not rates
    (dict(drop_path=True), "drop_path"),
    (dict(name=5), "name"),
])
def test_vitconfig_refuses_what_it_used_to_accept(kw, field):
    with pytest.raises(ValueError, match=rf"ViTConfig\.{field} must be"):
        ViTConfig(**{**dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7), **kw})


_ODD = st.sampled_from([0, -1, True, False, 1.5, float("nan"), float("inf"), "1", None])
_GOOD = {
    "img_size": st.sampled_from([8, 16, 32, (8, 16)]), "patch_size": st.sampled_from([1, 2, 4, 8]),
    "in_chans": st.sampled_from([1, 3]), "num_classes": st.sampled_from([0, 1, 5]),
    "embed_dim": st.sampled_from([4, 8, 12]), "depth": st.sampled_from([1, 2]), "num_heads": st.sampled_from([1, 2, 4]),
    "mlp_dim": st.sampled_from([1, 8]), "pool": st.sampled_from(["token", "gap"]), "class_token": st.booleans(),
    "pos_embed": st.sampled_from(["learned", "sincos2d", "none"]),
    "representation_size": st.sampled_from([None, 4]), "dropout": st.sampled_from([0.0, 0.5]),
    "attn_dropout": st.sampled_from([0.0, 0.5]), "drop_path": st.sampled_from([0.0, 0.5]),
    "layer_norm_eps": st.sampled_from([1e-6, 1e-5]), "qkv_bias": st.booleans(),
    "hybrid_layers": st.sampled_from([None, None, (), (1,)]), "hybrid_width": st.sampled_from([32, 64]),
}


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries(_GOOD), st.sampled_from([None, *_GOOD]), _ODD)
def test_every_accepted_vitconfig_builds_and_runs(d, field, odd):
    """A config ViTConfig accepts builds, runs a forward on its own input size and gives finite logits; what it
    refuses is a ValueError (or TypeError) naming a field."""
    if field is not None:
        d = {**d, field: odd}
    try:
        cfg = ViTConfig(**d)
    except (ValueError, TypeError) as e:
        assert "ViTConfig." in str(e) or "img_size" in str(e)
        return
    for name in ("class_token", "qkv_bias"):
        assert isinstance(getattr(cfg, name), bool)
    model = vitlab.VisionTransformer(cfg).eval()
    h, w = cfg.img_hw
    with torch.no_grad():
        y = model(torch.randn(2, cfg.in_chans, h, w))
    assert y.shape[0] == 2 and torch.isfinite(y).all()


# -- the weights never become (or are saved) non-finite ---------------------------------------------------------

def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                               patch_size=7, in_chans=1, num_classes=10)


@pytest.mark.parametrize("lr, weight_decay", [(1e30, 1e9), (1e38, 0.0)])
def test_train_step_reports_an_update_that_overflows_the_weights(lr, weight_decay):
    # (1e30, 1e9): the decay factor 1 - lr * wd overflows float32, the weights become inf / nan;
    # (1e38, 0): Adam's step size lr / (1 - beta1) does not fit a float32 scalar (torch raised its own error)
    model = _tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    batch = [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))]
    res = train_step(model, opt, batch, lr=lr, device=torch.device("cpu"), precision="fp32")
    assert res.applied and math.isfinite(res.loss) and math.isfinite(res.grad_norm)  # loss and grads were fine
    assert not res.weights_finite
    assert all_finite([p.detach() for p in _tiny_model().parameters()])


def test_all_finite_sees_nan_and_inf_but_not_huge_finite_weights():
    assert all_finite([torch.full((3,), 1e30), torch.zeros(2)])  # a 2-norm would overflow to inf here
    for bad in NON_FINITE:
        assert not all_finite([torch.zeros(5), torch.tensor([1.0, bad])])


def test_run_whose_update_blows_up_the_weights_stops_and_keeps_only_finite_files(tmp_path):
    # SGD at lr 1e25 trains normally while the loss is scaled by 1e-25; at step 3 the loss (still finite, ~2e16) is
    # scaled by 1e16, the grad norm too (~1e16, finite), and the update (1e25 x ~1e16) overflows float32: the loss
    # and grad-norm guards see nothing wrong
    calls = {"n": 0}

    def scale(loss: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return loss * (1e16 if calls["n"] >= 3 else 1e-25)

    r = tiny_recipe({"name": "sgd", "lr": 1e25, "momentum": 0.0}, checkpoint_every=1, max_bad_steps=1)
    with pytest.raises(NonFiniteError, match=r"step 3's update overflowed float32.*the weights would be inf or "
                                             r"nan.*without saving them\. The last good checkpoint, step 2, is kept"):
        train(r, tmp_path / "run", progress=False, on_loss=scale)
    ckpts = tmp_path / "run" / "checkpoints"
    assert list_checkpoints(ckpts) == [1, 2]
    assert all(finite_file(p) for p in ckpts.glob("*.safetensors"))
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_a_non_finite_checkpoint_is_never_written(tmp_path, monkeypatch):
    # the last line of defence: should anything let inf weights through a step, saving refuses to write them
    real_step = run_mod.train_step

    def step_then_corrupt(model, *args, **kwargs) -> StepResult:
        res = real_step(model, *args, **kwargs)
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("nan")
        return res

    monkeypatch.setattr(run_mod, "train_step", step_then_corrupt)
    r = tiny_recipe({"lr": 1e-3}, steps=2, checkpoint_every=1)
    with pytest.raises(NonFiniteError, match=r"refusing to write the checkpoint of step 1: weights \S+ holds inf or "
                                             r"nan values\. No checkpoint had been written yet"):
        train(r, tmp_path / "run", progress=False)
    assert list_checkpoints(tmp_path / "run" / "checkpoints") == []
    assert not list((tmp_path / "run").rglob("*.safetensors"))


def test_cli_run_that_blows_up_exits_1_with_one_true_line(tmp_path, capsys):
    run = tmp_path / "run"
    sets = ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=64", "data.dataset=synthetic",
            "train.steps=2", "train.epochs=null", "train.time_budget_min=null", "train.evaluators.eval.max_samples=100",
            "train.checkpoint_every=0", "optim.lr=1e30", "optim.weight_decay=1e9", "schedule.warmup_steps=0"]
    rc = main(["train", str(ROOT / "configs/fmnist_scratch.yaml"), "-o", str(run), "--no-progress",
               *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("vitlab train: error: step 1's update overflowed float32")
    assert "No checkpoint had been written yet" in err[-1]
    assert not list(run.rglob("*.safetensors")) and not (run / "model.safetensors").exists()


# -- inputs the model cannot take -------------------------------------------------------------------------------

@pytest.mark.parametrize("x, error, message", [
    (torch.zeros(1, 1, 28, 28, dtype=torch.uint8), TypeError,
     r"got uint8 pixels; expected a float tensor of shape \(B, C, H, W\), normalised .*vitlab\.data\.transforms_for"),
    (torch.zeros(1, 1, 28, 28, dtype=torch.float64), TypeError, r"got float64 images for a float32 model"),
    (torch.zeros(1, 1, 28, 28, dtype=torch.int64), TypeError, r"got a tensor of dtype int64; expected a float tensor"),
    (torch.zeros(1, 1, 28, 28, dtype=torch.bool), TypeError, r"got a tensor of dtype bool"),
    (np.zeros((1, 1, 28, 28), np.float32), TypeError, r"got numpy\.ndarray \(torch\.from_numpy"),
    ([[0.0]], TypeError, r"expected a float tensor of shape \(B, C, H, W\).*; got list"),
    (torch.zeros(1, 28, 28), ValueError, r"expected images of shape \(B, C, H, W\), got \(1, 28, 28\)"),
])
def test_wrong_inputs_get_our_message(x, error, message):
    model = _tiny_model().eval()
    for call in (model, model.forward_features, lambda t: model.forward_intermediates(t)):
        with pytest.raises(error, match=message):
            call(x)


def test_other_float_inputs_run_under_autocast():
    model = _tiny_model().eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


@pytest.mark.parametrize("field, value", [("mean", [float("nan")] * 3), ("std", [1.0, float("inf"), 1.0])])
def test_preprocess_from_a_weights_file_refuses_non_finite_statistics(field, value):
    from vitlab.models.preprocess import Preprocess

    with pytest.raises(ValueError, match=rf"preprocess\.{field} must be a list of finite numbers"):
        Preprocess(img_size=224, **{field: value})
