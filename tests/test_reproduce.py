"""`vitlab reproduce`: the four experiments' quick settings end to end through the CLI (the report's numbers are the
sub-runs' own report.json numbers, finished sub-runs are skipped, unfinished ones resumed), `--seeds` (one sub-run
per seed, resumable per seed, mean ± standard error), `--plan`, the verdict over seeds against closed-form standard
errors, the budget arithmetic, the plan and recipe guards, and the two measures `inside` defines, against closed
forms."""

import base64
import contextlib
import io
import json
import os
import re
import signal

import numpy as np
import pytest
import yaml

from vitlab.cli import main
from vitlab.paper import budget, data_scale, inside, resolution, transfer
from vitlab.paper.forecast import forecast
from vitlab.paper.inside import low_frequency_share, rollout_on_object
from vitlab.paper.recipes import data_section, model_section, pretrain_recipe
from vitlab.paper.stats import arm, combine, difference, seed_name, verdict
from vitlab.paper.subrun import run_or_resume

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _reproduce(experiment: str, out, *extra: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["reproduce", experiment, "-o", str(out), "--quick", "--threads", "1", "--no-progress",
                     *extra]) == 0
    printed = buf.getvalue()
    page = out / experiment / "report" / "report.html"
    assert f"report: {page}" in printed
    result = json.loads((page.parent / "result.json").read_text())
    html = page.read_text()
    # every figure: a PNG file, the same bytes inlined in the page, its numbers as JSON
    pngs = sorted(page.parent.glob("*.png"))
    assert pngs
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert base64.b64encode(data).decode() in html
        json.loads(png.with_suffix(".json").read_text())
    assert result["claims"] and all(c["verdict"] in ("yes", "no", "partly", "within noise") for c in result["claims"])
    for c in result["claims"]:
        assert f"[{c['verdict']:>12}] {c['measured']}" in printed
    assert "NaN" not in (page.parent / "result.json").read_text()
    return result


def _run_report(run_dir) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def _recipe(run_dir) -> dict:
    return yaml.safe_load((run_dir / "recipe.yaml").read_text())


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def quick_root(tmp_path_factory):
    """The four experiments' quick settings run once, in order, in one OUT: (OUT, {experiment: result.json})."""
    out = tmp_path_factory.mktemp("paper")
    return out, {name: _reproduce(name, out) for name in ("data-scale", "transfer", "resolution", "inside")}


@pytest.mark.slow
def test_quick_experiments_end_to_end_and_resume(quick_root):
    out, results = quick_root
    ds = results["data-scale"]
    s = ds["settings"]
    settings = data_scale.Settings(**s)
    assert set(ds["runs"]) == {f"{k}-{n}" for k in s["models"] for n in s["sizes"]}
    for name, r in ds["runs"].items():
        rep = _run_report(out / "data-scale" / name)
        assert r["top1"] == rep["final"]["top1"] and r["fewshot"] == rep["evaluators"]["fewshot"]["5shot"]
        # an epoch budget per size: at most that many steps, fewer when early stopping ended the run
        planned = settings.steps(r["size"], s["epochs"][s["sizes"].index(r["size"])])
        assert r["planned_steps"] == planned and rep["step"] <= planned
        assert r["stopped_early"] == (rep["step"] < planned) and rep["images_seen"] == rep["step"] * s["batch_size"]
        assert r["epochs"] == rep["images_seen"] / r["size"]
        # the reported top-1 scores the weights of the best validation evaluation (the lowest val loss), logged on
        # the val split
        assert r["best_step"] == rep["best_step"] <= rep["step"]
        vals = [row for row in _metrics(out / "data-scale" / name) if row["split"] == "eval_val"]
        best = min(vals, key=lambda v: v["loss"])
        assert best["step"] == rep["best_step"] and best["top1"] == rep["best_val_top1"] == r["best_val_top1"]
        assert rep["bad_data"]["train"]["num_skipped"] == 0
        assert r["status"] == "trained"
        assert _recipe(out / "data-scale" / name)["data"]["inception_crop"] is False  # no augmentation
        # early stopping judges the val loss with a patience in epochs; the run's report has the curve
        tr_ = _recipe(out / "data-scale" / name)["train"]
        es = tr_["evaluators"]["early_stop"]
        assert es["type"] == "early_stop" and es["metric"] == "loss" and es["patience_epochs"] == s["patience_epochs"]
        assert rep["early_stop"]["best_step"] == rep["best_step"] and len(rep["early_stop"]["curve"]) == len(vals)
    # the page shows the table's numbers
    html = (out / "data-scale" / "report" / "report.html").read_text()
    assert f"{100 * ds['runs']['bit-100']['top1']:.1f}%" in html

    tr = results["transfer"]
    ts = transfer.Settings(**tr["settings"])
    for task, rows in tr["table"].items():
        assert set(rows) == {"1", "all"}
        for labels, row in rows.items():
            ft, sc = (_run_report(out / "transfer" / f"{task}-{how}-{labels}") for how in ("finetune", "scratch"))
            assert row["finetune"] == ft["final"]["top1"] and row["scratch"] == sc["final"]["top1"]
            # both methods: the same steps, sized by epochs of the labelled images; each its own optimizer
            images = row["images"]
            assert images == (int(labels) * (4 if task == "fmnist-heldout" else 10) if labels != "all" else
                              transfer.train_images(task, True, None))
            assert ft["step"] == sc["step"] == row["steps"] == ts.steps(images)
            assert ft["images_seen"] == sc["images_seen"] == row["steps"] * min(ts.batch_size, images)
            ft_optim = _recipe(out / "transfer" / f"{task}-finetune-{labels}")["optim"]
            assert ft_optim["name"] == "sgd"  # the lr scaled linearly with the batch
            assert ft_optim["lr"] == pytest.approx(ts.finetune_lr * min(ts.batch_size, images) / ts.batch_size)
            assert _recipe(out / "transfer" / f"{task}-scratch-{labels}")["optim"]["name"] == "adamw"
        assert 0.0 <= rows["all"]["probe"] <= 1.0
    up = _run_report(out / "upstream")
    assert tr["upstream"]["top1"] == up["final"]["top1"]

    rs = results["resolution"]
    low, high = rs["settings"]["low_size"], rs["settings"]["size"]
    assert _recipe(out / "resolution" / f"pretrain-{low}px")["model"]["img_size"] == low < high
    for mode, row in rs["table"].items():
        d = out / "resolution" / f"finetune-{high}px-{mode}"
        assert row["finetune"] == _run_report(d)["final"]["top1"]
        r = _recipe(d)
        assert r["model"]["img_size"] == high and r["init"]["pos_embed_resize"] == mode
        assert r["init"]["checkpoint"] == str(out / "resolution" / f"pretrain-{low}px" / "model.safetensors")
    control = out / "resolution" / f"continue-{low}px"
    assert rs["continue_low"] == _run_report(control)["final"]["top1"]
    assert _recipe(control)["model"]["img_size"] == low  # the same steps and recipe, at the low resolution
    assert _run_report(control)["step"] == _run_report(out / "resolution" / f"finetune-{high}px-bicubic")["step"]

    ins = results["inside"]
    seen = {f"data-scale/{n}": r["images_seen"] for n, r in ds["runs"].items() if n.startswith("vit-")}
    seen["upstream"] = up["images_seen"]
    assert ins["best"] == max(seen, key=lambda n: (seen[n], ins["models"][n]["top1"]))  # the longest-trained
    assert set(ins["models"]) == set(seen)
    assert not ins["runs"]  # the other experiments' ViTs were analysed; nothing trained
    assert (out / "inside" / "report" / "attention_distance.png").is_file()
    trend = inside.data_trend(ins)
    assert trend["sizes"] == s["sizes"]
    assert trend["min_share"] == [ins["models"][f"data-scale/vit-{n}"]["lowest_layer_min_share"] for n in s["sizes"]]

    # again: every sub-run is read back (status "done"), no weights rewritten
    stamp = {p: p.stat().st_mtime_ns for p in (out / "data-scale").glob("*/model.safetensors")}
    again = _reproduce("data-scale", out)
    assert {r["status"] for r in again["runs"].values()} == {"done"}
    assert stamp == {p: p.stat().st_mtime_ns for p in (out / "data-scale").glob("*/model.safetensors")}
    assert again["runs"] == {k: {**v, "status": "done"} for k, v in ds["runs"].items()}


@pytest.mark.slow
def test_the_reports_read_in_a_browser(quick_root):
    from .browser import Browser, assert_page_reads, require_browser

    require_browser()
    out, results = quick_root
    browser = Browser()
    try:
        for name, result in results.items():
            view = browser.view(out / name / "report" / "report.html")
            claims = [c["measured"] for c in result["claims"]]
            assert_page_reads(view, numbers=claims, min_images=len(list((out / name / "report").glob("*.png"))))
    finally:
        browser.close()


def _tiny_recipe(steps: int):
    return pretrain_recipe(model_section("vit", True), data_section(True), steps=steps, batch_size=16, warmup=1)


def test_an_interrupted_subrun_resumes_from_its_checkpoint(tmp_path):
    from vitlab.train import train

    recipe = _tiny_recipe(4)  # checkpoints every steps // 4 = 1 step
    run_dir = tmp_path / "vit"

    def stop_at_2(step, _):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop saves and stops, as on a real SIGTERM

    first = train(recipe, run_dir, progress=False, on_step=stop_at_2)
    assert first.status.startswith("interrupted") and first.step == 2
    r = run_or_resume("vit", recipe, run_dir)
    assert r.status == "resumed" and r.steps == 4
    assert re.search(r"step_0+2", _run_report(run_dir)["resumed_from"])
    assert run_or_resume("vit", recipe, run_dir).status == "done"


def test_a_subrun_of_another_recipe_is_refused(tmp_path):
    run_or_resume("vit", _tiny_recipe(2), tmp_path / "vit")
    with pytest.raises(ValueError, match=r"train.steps: 2 -> 3"):
        run_or_resume("vit", _tiny_recipe(3), tmp_path / "vit")


def test_a_plan_made_with_other_options_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "step_seconds", lambda model, bs, k=10: 0.5)
    data_scale.plan(tmp_path / "data-scale", True, None)
    with pytest.raises(ValueError, match=r"made with --quick no --budget; run it with the same options"):
        data_scale.plan(tmp_path / "data-scale", True, 3.0)
    s, _ = data_scale.plan(tmp_path / "data-scale", True, None)  # the same options: the saved plan
    assert s.epochs == data_scale.Settings.for_run(True).epochs


def test_budget_scales_every_step_count_by_one_factor(tmp_path, monkeypatch):
    per_step = {"ViT-Ti/16": 0.2, "BiT-R14x1": 0.05}
    monkeypatch.setattr(budget, "step_seconds",
                        lambda model, bs, k=10: per_step[model["name"]] + 0.1 * ("hybrid_layers" in model))
    s0 = data_scale.Settings.for_run(True)
    # closed form: vit 0.2 s, hybrid 0.3 s, bit 0.05 s per step, each at every size's full epoch budget
    steps = sum(-(-int(e * n) // s0.batch_size) for n, e in zip(s0.sizes, s0.epochs))  # ceil per size
    predicted = steps * (0.2 + 0.3 + 0.05)
    s, probe = data_scale.plan(tmp_path / "ds", True, 1.0)
    assert probe["predicted_min_at_factor_1"] == pytest.approx(predicted / 60)
    assert probe["factor"] == pytest.approx(60 / predicted)
    assert s.epochs == pytest.approx([e * 60 / predicted for e in s0.epochs])  # one factor for every size
    saved = json.loads((tmp_path / "ds" / "plan.json").read_text())
    assert saved["settings"]["epochs"] == s.epochs and saved["options"]["budget_min"] == 1.0
    with pytest.raises(ValueError, match="--budget must be a positive number"):
        budget.budget_factor([], 0)


def test_the_lead_claim_and_its_crossover():
    s = {"sizes": [1000, 10000, 100000], "shots": 5}

    def result(bit, vit):  # one seed each, scored on 10,000 test images (1,000 for the probe)
        runs = {f"{k}-{n}": {"top1": a, "fewshot": a, "test_images": 10000} for k, accs in (("bit", bit), ("vit", vit))
                for n, a in zip(s["sizes"], accs)}
        return {"settings": {**s, "probe_test": 1000}, "runs": runs}

    falling = result([0.80, 0.85, 0.90], [0.70, 0.79, 0.88])  # leads 10, 6, 2 points: 4 points less per 10x
    assert data_scale.leads(falling, "top1") == pytest.approx({1000: 0.10, 10000: 0.06, 100000: 0.02})
    assert data_scale.crossover(data_scale.leads(falling, "top1")) == pytest.approx(10 ** 5.5)
    verdicts = [c.verdict for c in data_scale.claims(falling)]
    assert verdicts == ["yes", "yes", "no"]  # top-1 and 5-shot leads fall at every step; ViT still behind
    # one seed: the standard error of each lead is the two test-set binomials', e.g. at 1,000 images
    se_1k = ((0.8 * 0.2 + 0.7 * 0.3) / 10000) ** 0.5
    assert data_scale.lead_estimates(falling, "top1")[1000].se == pytest.approx(se_1k)
    bumpy = result([0.80, 0.85, 0.90], [0.70, 0.72, 0.88])  # leads 10, 13, 2: a rise of 3 is 3.4 standard errors
    assert data_scale.claims(bumpy)[0].verdict == "partly"
    within_noise = result([0.80, 0.85, 0.90], [0.70, 0.79, 0.835])  # leads 10, 6, 6.5: a rise of 0.5 is 0.6 of one
    claim = data_scale.claims(within_noise)[0]
    assert claim.verdict == "yes" and claim.numbers["largest_rise"] == pytest.approx(0.005)
    assert "falls at 1 of 2 steps, the largest rise 0.5" in claim.measured
    flat = result([0.80, 0.85, 0.90], [0.70, 0.75, 0.80])  # leads 10, 10, 10: no change beyond noise
    assert data_scale.claims(flat)[0].verdict == "within noise"
    assert data_scale.crossover(data_scale.leads(flat, "top1")) is None
    growing = result([0.80, 0.85, 0.90], [0.70, 0.72, 0.70])  # leads 10, 13, 20
    assert data_scale.claims(growing)[0].verdict == "no"
    close = result([0.80, 0.85, 0.900], [0.70, 0.79, 0.905])  # the ViT ahead by 0.5 at the largest: within noise
    assert data_scale.claims(close)[-1].verdict == "within noise"


def test_raghu_trend_on_the_lowest_layer():
    models = {f"data-scale/vit-{n}": {"kind": "data-scale", "size": n, "steps": 10, "lowest_layer_min_share": a,
                                      "lowest_layer_mean_share": b}
              for n, a, b in ((1000, 0.9, 0.95), (10000, 0.6, 0.9), (60000, 0.3, 0.8))}
    models["upstream"] = {"kind": "upstream", "size": None, "steps": 99, "lowest_layer_min_share": 0.1,
                          "lowest_layer_mean_share": 0.1}
    trend = inside.data_trend({"models": models})
    assert trend["sizes"] == [1000, 10000, 60000] and trend["min_share"] == [0.9, 0.6, 0.3]
    assert trend["spearman_min"] == pytest.approx(-1.0) and trend["spearman_mean"] == pytest.approx(-1.0)


def test_low_frequency_share_closed_forms():
    p = 4
    flat = np.ones((1, 1, p, p))  # all energy at DC
    checker = np.indices((p, p)).sum(0) % 2 * 2.0 - 1  # all energy at the Nyquist frequency (2, 2)
    assert low_frequency_share(flat) == pytest.approx(1.0)
    assert low_frequency_share(checker[None, None]) == pytest.approx(0.0)
    # a delta has a flat spectrum: the share is the fraction of low bins, 3 x 3 of 4 x 4
    delta = np.zeros((1, 1, p, p))
    delta[0, 0, 1, 2] = 1
    assert low_frequency_share(delta) == pytest.approx(9 / 16)
    with pytest.raises(ValueError, match=r"\(K, C, P, P\)"):
        low_frequency_share(np.ones((p, p)))


def test_rollout_on_object_closed_forms():
    display = np.zeros((1, 8, 8, 1))
    display[0, :4, :4] = 1.0  # the object: the top-left quarter (one of 2x2 patches)
    uniform = np.ones((1, 2, 2))
    r = rollout_on_object(display, uniform)
    assert r["object_area_share"] == pytest.approx(0.25) and r["ratio"] == pytest.approx(1.0)
    on_object = np.array([[[3.0, 1.0], [0.0, 0.0]]])
    r = rollout_on_object(display, on_object)
    assert r["rollout_mass_on_object"] == pytest.approx(0.75) and r["ratio"] == pytest.approx(3.0)


@pytest.mark.parametrize("argv, message", [
    (["reproduce", "everything"], "invalid choice: 'everything'"),
    (["reproduce", "inside", "--budget", "0"], "--budget must be a positive number of minutes"),
    (["reproduce", "inside", "--threads", "0"], "--threads"),
])
def test_bad_command_lines_are_usage_errors(argv, message, capsys, tmp_path):
    try:
        code = main([*argv, "-o", str(tmp_path)])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any work


def test_white_noise_share_is_the_expected_share_of_random_filters():
    from vitlab.paper.inside import white_noise_low_share

    rng = np.random.default_rng(0)
    noise = rng.standard_normal((4000, 1, 4, 4))
    assert white_noise_low_share(4) == pytest.approx(9 / 16)
    assert low_frequency_share(noise) == pytest.approx(white_noise_low_share(4), abs=0.01)  # Parseval, averaged


def test_verdict_over_seeds_closed_forms():
    a, b = arm([0.91, 0.90, 0.92]), arm([0.89, 0.88, 0.90])
    # the seeds' sample standard deviation is 0.01 for both: each mean's standard error 0.01 / sqrt(3)
    assert a.mean == pytest.approx(0.91) and a.se == pytest.approx(0.01 / 3 ** 0.5) and a.source == "seeds"
    d = difference(a, b)
    assert d.mean == pytest.approx(0.02) and d.se == pytest.approx(0.01 * (2 / 3) ** 0.5)  # 0.00816
    assert verdict(d.mean, d.se) == "yes"  # 0.02 >= 2 x 0.00816
    assert verdict(d.mean, d.se, bar=0.01) == "within noise"  # 0.01 above the bar < 2 x 0.00816
    assert verdict(d.mean, d.se, bar=0.035) == "within noise"  # 0.015 below it: < 2 x 0.00816 = 0.0163
    assert verdict(d.mean, d.se, bar=0.037) == "no"  # 0.017 below it: >= 2 standard errors
    assert verdict(0.5, float("nan")) == "within noise"  # no standard error: nothing decided
    # one seed: the binomial standard error of the test images
    one = arm([0.97], test_images=500)
    assert one.se == pytest.approx((0.97 * 0.03 / 500) ** 0.5) and one.source == "test set"  # ~0.76 points
    assert arm([0.97]).source == "none"
    assert combine(["yes", "yes"]) == "yes" and combine(["yes", "within noise"]) == "partly"
    assert combine(["within noise"] * 3) == "within noise"
    assert seed_name("vit-1000", 0) == "vit-1000" and seed_name("vit-1000", 2) == "vit-1000-seed2"


def test_resolution_claim_reads_the_bar_in_standard_errors():
    def result(control, ft):
        return {"settings": {"low_size": 16, "size": 28, "modes": ["bicubic"], "steps": 10},
                "table": {"bicubic": {"no_finetune": 0.7, "finetune": sum(ft) / len(ft), "finetune_seeds": ft}},
                "pretrained_low": 0.8, "continue_low": sum(control) / len(control), "continue_low_seeds": control,
                "test_images": 10000}

    # gain +4.0 ± 0.82 over a bar of +1: 3 points above it, 3.7 standard errors: yes; +1.5: 0.6 of one: within noise
    assert resolution.claims(result([0.89, 0.88, 0.90], [0.93, 0.92, 0.94]))[0].verdict == "yes"
    assert resolution.claims(result([0.89, 0.88, 0.90], [0.905, 0.895, 0.915]))[0].verdict == "within noise"
    assert resolution.claims(result([0.89, 0.88, 0.90], [0.88, 0.87, 0.89]))[0].verdict == "no"  # -1: 2.4 below
    # gain +1.0: on the bar: within noise (the second host)
    claim = resolution.claims(result([0.89, 0.88, 0.90], [0.90, 0.89, 0.91]))[0]
    assert claim.verdict == "within noise" and claim.numbers["gain_se"] == pytest.approx(0.01 * (2 / 3) ** 0.5)
    assert "3 seeds per arm" in claim.measured
    # one seed each: the test images' standard error, sqrt(0.9 0.1 / 1e4 + 0.89 0.11 / 1e4) = 0.43 points
    claim = resolution.claims(result([0.89], [0.90]))[0]
    assert claim.numbers["gain_se"] == pytest.approx(((0.9 * 0.1 + 0.89 * 0.11) / 10000) ** 0.5)
    assert claim.verdict == "within noise" and "one seed per arm" in claim.measured


def test_seeds_add_runs_per_seed_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "paper"
    one = _reproduce("resolution", out)
    assert one["seeds"] == 1 and not list((out / "resolution").glob("*-seed*"))
    stamp = {p: p.stat().st_mtime_ns for p in (out / "resolution").glob("*/model.safetensors")}
    two = _reproduce("resolution", out, "--seeds", "2")
    # seed 0 is the one-seed run, read back; seed 1 of every compared arm is its own run, with train.seed 1
    assert {n: r["status"] for n, r in two["runs"].items() if "-seed" not in n} == {n: "done" for n in one["runs"]}
    seeded = {n for n in two["runs"] if n.endswith("-seed1")}
    assert seeded == {"continue-16px-seed1", "finetune-28px-bicubic-seed1", "finetune-28px-bilinear-seed1"}
    for n in seeded:
        assert _recipe(out / "resolution" / n)["train"]["seed"] == 1 and two["runs"][n]["status"] == "trained"
    assert stamp == {p: p.stat().st_mtime_ns for p in stamp}
    control = two["continue_low_seeds"]
    assert control == [_run_report(out / "resolution" / d)["final"]["top1"] for d in ("continue-16px",
                                                                                      "continue-16px-seed1")]
    assert two["claims"][0]["numbers"]["continue_low"] == pytest.approx(sum(control) / 2)
    assert "2 seeds per arm" in two["claims"][0]["measured"]
    # a rerun with the same seeds trains nothing
    again = _reproduce("resolution", out, "--seeds", "2")
    assert {r["status"] for r in again["runs"].values()} == {"done"}
    # the forecast: every run of 3 seeds, those finished not left to train
    monkeypatch.setattr("vitlab.paper.forecast.step_seconds", lambda model, bs, k=10: 0.5)
    f = forecast("resolution", out, quick=True, seeds=3)
    s = resolution.Settings.for_run(True)
    assert f["runs"] == 1 + 3 * (1 + len(s.modes)) and f["runs_left"] == 1 + len(s.modes)
    assert f["predicted_min"] == pytest.approx((s.pre_steps + 3 * (1 + len(s.modes)) * s.steps) * 0.5 / 60)
    assert f["left_min"] == pytest.approx((1 + len(s.modes)) * s.steps * 0.5 / 60)


def test_a_plan_of_an_earlier_version_is_refused(tmp_path):
    exp = tmp_path / "data-scale"
    data_scale.plan(exp, True, None)
    saved = json.loads((exp / "plan.json").read_text())
    saved["settings"]["patience"] = 5  # the retired evaluations-patience
    (exp / "plan.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"made by an earlier version of vitlab \(settings patience are gone"):
        data_scale.plan(exp, True, None)


def test_plan_forecasts_a_budgeted_out_with_its_own_settings(tmp_path, monkeypatch):
    """`--plan --budget B` on an OUT made with `--budget B` forecasts that plan's scaled steps (it was refused: the
    forecast read the plan as if made without a budget); without a plan.json it scales as the run would, writing
    nothing; other options are refused as `vitlab reproduce` refuses them."""
    monkeypatch.setattr(budget, "step_seconds", lambda model, bs, k=10: 0.5)
    monkeypatch.setattr("vitlab.paper.forecast.step_seconds", lambda model, bs, k=10: 0.5)
    one = forecast("resolution", tmp_path, quick=True, seeds=1, budget_min=0.5)
    assert one["predicted_min"] == pytest.approx(0.5, rel=0.05)  # one seed: the budget (steps rounded to whole)
    fresh = forecast("resolution", tmp_path, quick=True, seeds=2, budget_min=0.5)
    assert not (tmp_path / "resolution" / "plan.json").exists()
    assert 0.5 < fresh["predicted_min"] < 1.0  # the second seed repeats every arm but the shared pre-training
    resolution.plan(tmp_path / "resolution", True, 0.5)
    same = forecast("resolution", tmp_path, quick=True, seeds=2, budget_min=0.5)
    assert same["predicted_min"] == pytest.approx(fresh["predicted_min"])
    with pytest.raises(ValueError, match="run it with the same options"):
        forecast("resolution", tmp_path, quick=True, seeds=2)
