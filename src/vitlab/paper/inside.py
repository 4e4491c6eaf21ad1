"""Inside the model (paper Sec. 4.5, Fig. 6-7) on the best ViT of the other experiments: the patch-embedding
filters, the position-embedding similarity, the mean attention distance per head against depth, and attention
rollout, each with a measured statement of whether the paper's pattern appears (`vitlab.analysis.findings` plus
two measures defined here: the filters' low-frequency energy against the same model at initialisation, and the
rollout's mass on the garment against its area).

The best ViT is the data-scale ViT with the highest test top-1 (OUT/data-scale/vit-*); without any, this experiment
trains one itself (OUT/inside/vit). The other ViTs found serve as the experiment that explains a missing pattern:
the data-scale ViTs (the same steps on 1 k to 60 k images: how much data the structure needs) and the resolution
fine-tunes (the same model on 7x7, 10x10 and 14x14 grids: how much grid the structure needs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .recipes import data_section, model_section, pretrain_recipe
from .report import Claim, Section, pct, png_bytes
from .subrun import finished, run_or_resume

NAME = "inside"
LOW_FREQ_MARGIN = 0.1  # the filters count as smooth when their low-frequency share beats random filters' by this
OBJECT_RATIO = 1.1  # rollout counts as "on the object" when its mass there exceeds the object's area share by 10%


@dataclass
class Settings:
    """What the experiment runs.

    Attributes:
        num_images: Test images analysed per model.
        steps, batch_size, warmup: The ViT trained here when no data-scale ViT exists.
        quick: Tiny models on synthetic data.
    """

    num_images: int = 32
    steps: int = 128
    batch_size: int = 128
    warmup: int = 15
    quick: bool = False

    @classmethod
    def for_run(cls, quick: bool) -> Settings:
        return cls(num_images=8, steps=3, batch_size=16, warmup=1, quick=True) if quick else cls()


def _candidates(out: Path) -> list[dict[str, Any]]:
    """Finished ViT runs of the other experiments: {"name", "run_dir", "top1", "kind", "size" / "img_size"}."""
    import json

    def report(run_dir: Path) -> dict[str, Any]:
        return json.loads((run_dir / "report.json").read_text(encoding="utf-8"))

    found = []
    for run_dir in sorted((out / "data-scale").glob("vit-*")):
        if finished(run_dir):
            r = report(run_dir)
            found.append({"name": run_dir.name, "run_dir": run_dir, "top1": r["final"]["top1"], "kind": "data-scale",
                          "size": int(run_dir.name.split("-")[1]), "steps": r["step"]})
    upstream_steps = report(out / "upstream")["step"] if finished(out / "upstream") else 0
    for run_dir in sorted((out / "resolution").glob("finetune-*")):
        if finished(run_dir) and ("bicubic" in run_dir.name or run_dir.name == "finetune-28px"):
            r = report(run_dir)
            found.append({"name": f"resolution/{run_dir.name}", "run_dir": run_dir, "top1": r["final"]["top1"],
                          "kind": "resolution", "img_size": int(run_dir.name.split("-")[1].removesuffix("px")),
                          "steps": upstream_steps + r["step"]})  # pre-training and fine-tuning
    return found


def _images(model: Any, quick: bool, n: int, classes: list[int] | None = None):
    from ..data import DataConfig, build_eval_data

    data = data_section(quick, **({"classes": classes} if classes else {}))
    ev = build_eval_data(DataConfig.from_dict(data), "test", img_size=model.cfg.img_size,
                         in_chans=model.cfg.in_chans, batch_size=n)
    return next(iter(ev))[0]


def low_frequency_share(components: np.ndarray) -> float:
    """Mean share of the energy of (K, C, P, P) filter components in the lowest spatial frequencies (the DFT bins
    with |f_y|, |f_x| <= P / 4 cycles per patch, DC included); white noise gives that share of the bins."""
    c = np.asarray(components, dtype=np.float64)
    if c.ndim != 4 or c.shape[-1] != c.shape[-2]:
        raise ValueError(f"expected filter components (K, C, P, P), got {c.shape}")
    f = np.abs(np.fft.fft2(c, axes=(-2, -1))) ** 2  # (K, C, P, P) energy per frequency
    p = c.shape[-1]
    freq = np.abs(np.fft.fftfreq(p) * p)  # cycles per patch
    low = (freq[:, None] <= p / 4) & (freq[None, :] <= p / 4)  # (P, P)
    return float((f[:, :, low].sum(axis=(1, 2)) / f.sum(axis=(1, 2, 3))).mean())


def white_noise_low_share(p: int) -> float:
    """`low_frequency_share`'s expectation for random (white-noise) P x P filters: the share of low DFT bins."""
    freq = np.abs(np.fft.fftfreq(p) * p)
    return float(((freq[:, None] <= p / 4) & (freq[None, :] <= p / 4)).mean())


def rollout_on_object(display: np.ndarray, rollout: np.ndarray, threshold: float = 0.25) -> dict[str, float]:
    """How much of the rollout mass falls on the object: per image, the share of the (gh, gw) map on patches whose
    mean brightness (display images in [0, 1], background black) is above `threshold`, against those patches'
    share of the area. Returns the means over images and their ratio."""
    n, gh, gw = rollout.shape
    img = display.mean(-1)  # (n, H, W)
    H, W = img.shape[1:]
    patch = img[:, : gh * (H // gh), : gw * (W // gw)].reshape(n, gh, H // gh, gw, W // gw).mean((2, 4))
    obj = patch > threshold  # (n, gh, gw)
    mass = rollout / rollout.sum(axis=(1, 2), keepdims=True)
    on = float((mass * obj).sum(axis=(1, 2)).mean())
    area = float(obj.mean(axis=(1, 2)).mean())
    return {"rollout_mass_on_object": on, "object_area_share": area, "ratio": on / max(area, 1e-12)}


def _analyze(run_dir: Path, quick: bool, n: int, layer_maps: tuple[int, ...] = (), classes: list[int] | None = None):
    import torch

    from ..analysis.filters import filter_pca
    from ..analysis.findings import analyze
    from ..model import create_model
    from ..weights import load_model

    model = load_model(run_dir / "model.safetensors")
    result = analyze(model, _images(model, quick, n, classes), batch_size=n, layer_maps=layer_maps,
                     source=str(run_dir))
    k = min(8, result.filters.components.shape[0]) if result.filters is not None else 0
    extra: dict[str, Any] = {}
    if result.filters is not None:
        with torch.random.fork_rng():  # the same architecture at initialisation (seed 0), for reference
            torch.manual_seed(0)
            init = create_model(model.cfg)
        extra["filters_low_frequency"] = low_frequency_share(result.filters.components[:k])
        extra["filters_low_frequency_init"] = low_frequency_share(filter_pca(init, k).components)
        extra["filters_low_frequency_random"] = white_noise_low_share(result.filters.components.shape[-1])
    extra.update(rollout_on_object(result.images, result.attention.rollout))
    return result, extra


def _summary(result: Any, extra: dict[str, Any]) -> dict[str, Any]:
    f = result.findings
    att = result.attention
    out = {"grid": list(att.grid), "uniform_distance": att.uniform_distance, **extra}
    if "pos_embed_2d" in f:
        out["pos_neighbour_minus_far"] = f["pos_embed_2d"]["neighbour_similarity"] - f["pos_embed_2d"]["far_similarity"]
        out["pos_correlation"] = f["pos_embed_2d"]["correlation_with_distance"]
    d = f["distance_grows_with_depth"]
    out["distance_rise"] = (d["last_third_mean"] - d["first_third_mean"]) / att.uniform_distance
    out["distance_spearman"] = d["spearman_layer_vs_mean_distance"]
    e = f["early_local_and_global"]
    out["early_min_share"] = e["min_head_distance"] / att.uniform_distance
    out["early_max_share"] = e["max_head_distance"] / att.uniform_distance
    out["findings"] = {k: bool(v["yes"]) for k, v in f.items()}
    return out


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False) -> dict[str, Any]:
    from ..analysis.page import sections

    del budget_min  # analysis only, unless a ViT must be trained (then the setting's steps)
    s = Settings.for_run(quick)
    found = _candidates(out)
    runs: dict[str, dict[str, Any]] = {}
    if not [c for c in found if c["kind"] == "data-scale"]:
        recipe = pretrain_recipe(model_section("vit", quick), data_section(quick), steps=s.steps,
                                 batch_size=s.batch_size, warmup=s.warmup)
        r = run_or_resume("vit", recipe, out / NAME / "vit", progress=progress)
        runs["vit"] = r.to_dict()
        found.insert(0, {"name": "inside/vit", "run_dir": Path(r.run_dir), "top1": r.top1, "kind": "own",
                         "size": 60000 if not quick else 600, "steps": r.steps})
    ten_class = [c for c in found if c["kind"] in ("data-scale", "own")]
    best = max(ten_class, key=lambda c: c["top1"])
    depth_maps = (0, -1)
    best_result, best_extra = _analyze(best["run_dir"], quick, s.num_images, depth_maps)
    models = {best["name"]: {"top1": best["top1"], "kind": best["kind"], "size": best.get("size"),
                             "steps": best["steps"], **_summary(best_result, best_extra)}}
    for c in found:
        if c["name"] in models:
            continue
        classes = [0, 1, 2, 3, 4, 5] if c["kind"] == "resolution" else None
        res, extra = _analyze(c["run_dir"], quick, s.num_images, classes=classes)
        models[c["name"]] = {"top1": c["top1"], "kind": c["kind"], "size": c.get("size"), "steps": c["steps"],
                             "img_size": c.get("img_size"), **_summary(res, extra)}
    parts = sections(best_result)
    return {"experiment": NAME, "settings": s.__dict__, "runs": runs, "best": best["name"], "models": models,
            "_sections": parts}


def claims(result: dict[str, Any]) -> list[Claim]:
    m = result["models"][result["best"]]
    why = _why(result)
    out = []
    if "filters_low_frequency" in m:
        lf, lf0, lfr = m["filters_low_frequency"], m["filters_low_frequency_init"], m["filters_low_frequency_random"]
        ok = lf > lfr + LOW_FREQ_MARGIN
        out.append(Claim(
            paper="Fig. 7 left: the top principal components of the patch-embedding filters resemble plausible "
                  "basis functions (smooth, low-frequency) for the fine structure within each patch",
            measured=f"the top-8 components hold {100 * lf:.0f}% of their energy in the lowest spatial frequencies; "
                     f"random filters: {100 * lfr:.0f}% in expectation ({100 * lf0:.0f}% for this model at "
                     f"initialisation)" + ("" if ok else f"; {why['filters']}"),
            verdict="yes" if ok else "no",
            numbers={"low_frequency": lf, "low_frequency_random": lfr, "low_frequency_init": lf0}))
    if "pos_neighbour_minus_far" in m:
        ok = m["findings"].get("pos_embed_2d", False)
        out.append(Claim(
            paper="Fig. 7 centre: the position embeddings learn the 2-D image topology: closer patches have more "
                  "similar embeddings, with a row-column structure",
            measured=f"neighbour minus far-pair cosine similarity {m['pos_neighbour_minus_far']:.3f}, correlation "
                     f"with grid distance {m['pos_correlation']:.3f}" + ("" if ok else f"; {why['pos']}"),
            verdict="yes" if ok else "no",
            numbers={"neighbour_minus_far": m["pos_neighbour_minus_far"], "correlation": m["pos_correlation"]}))
    ok = m["findings"]["distance_grows_with_depth"]
    out.append(Claim(
        paper="Fig. 7 right: the attention distance increases with network depth",
        measured=f"last-third minus first-third layer mean distance {100 * m['distance_rise']:+.0f}% of uniform "
                 f"attention's, Spearman(layer, distance) {m['distance_spearman']:.2f}"
                 + ("" if ok else f"; {why['depth']}"),
        verdict="yes" if ok else "no",
        numbers={"distance_rise": m["distance_rise"], "spearman": m["distance_spearman"]}))
    ok = m["findings"]["early_local_and_global"]
    out.append(Claim(
        paper="Fig. 7 right: some heads attend to most of the image already in the lowest layers, others stay "
              "local",
        measured=f"lowest layers' heads span {100 * m['early_min_share']:.0f}% to {100 * m['early_max_share']:.0f}% "
                 f"of uniform attention's distance (local below 25%, global above 75%)"
                 + ("" if ok else f"; {why['early']}"),
        verdict="yes" if ok else "no",
        numbers={"early_min_share": m["early_min_share"], "early_max_share": m["early_max_share"]}))
    ratio = m["ratio"]
    out.append(Claim(
        paper="Fig. 6: the model attends to image regions that are semantically relevant for classification",
        measured=f"{100 * m['rollout_mass_on_object']:.0f}% of the rollout mass lies on the garment, which covers "
                 f"{100 * m['object_area_share']:.0f}% of the image (ratio {ratio:.2f})",
        verdict="yes" if ratio > OBJECT_RATIO else "no",
        numbers={"mass_on_object": m["rollout_mass_on_object"], "object_area": m["object_area_share"],
                 "ratio": ratio}))
    return out


def _why(result: dict[str, Any]) -> dict[str, str]:
    """For each pattern, what the other models show about the cause: the trend with data size and with grid size."""
    models = result["models"]
    ds = sorted((v for v in models.values() if v["kind"] in ("data-scale", "own")), key=lambda v: v["size"] or 0)
    rs = sorted((v for v in models.values() if v["kind"] == "resolution"), key=lambda v: v["grid"][0])

    def trend(rows: list[dict[str, Any]], key: str, label: str, unit: str, fmt: str = "{:.2f}") -> str:
        vals = [(r[label], r[key]) for r in rows if key in r]
        if len(vals) < 2:
            return ""
        return ", ".join(f"{lab}{unit}: {fmt.format(v)}" for lab, v in vals)

    def explain(key: str, what: str, fmt: str = "{:.2f}") -> str:
        parts = []
        t = trend(ds, key, "size", " images", fmt)
        if t:
            parts.append(f"{what} against training images at equal steps: {t}")
        grid = [dict(r, grid_label=f"{r['grid'][0]}x{r['grid'][1]}") for r in rs]
        seven = sorted((v for v in models.values() if v["grid"][0] == 7), key=lambda v: v["steps"])
        longest = [seven[0], seven[-1]] if len(seven) >= 2 and seven[-1]["steps"] > seven[0]["steps"] else []
        t = trend(longest, key, "steps", " steps", fmt)
        if t:
            parts.append(f"against training length (7x7 grid): {t}")
        t = trend(grid, key, "grid_label", " grid", fmt)
        if t:
            note = (" (the larger grids' tables are the 7x7 one interpolated, then briefly fine-tuned: smooth by "
                    "construction)") if key == "pos_neighbour_minus_far" else ""
            parts.append(f"against grid size: {t}{note}")
        return "; ".join(parts) or "no other ViT to compare (run data-scale and resolution first)"

    return {"filters": explain("filters_low_frequency", "low-frequency share"),
            "pos": explain("pos_neighbour_minus_far", "neighbour minus far similarity", "{:.3f}"),
            "depth": explain("distance_rise", "distance rise"),
            "early": explain("early_max_share", "widest early head (share of uniform)")}


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    from .figures import lines_plot

    models = result["models"]
    header = ["model", "test top-1", "grid", "filters low-freq (init, random)", "pos-emb near-far", "distance rise",
              "early heads (min-max share)", "rollout on object"]
    rows = []
    for name, m in models.items():
        lf = (f"{m['filters_low_frequency']:.2f} ({m['filters_low_frequency_init']:.2f}, "
              f"{m['filters_low_frequency_random']:.2f})"
              if "filters_low_frequency" in m else "-")
        rows.append([name + (" (best)" if name == result["best"] else ""), pct(m["top1"]),
                     f"{m['grid'][0]}x{m['grid'][1]}", lf, f"{m.get('pos_neighbour_minus_far', float('nan')):.3f}",
                     f"{m['distance_rise']:+.2f}", f"{m['early_min_share']:.2f}-{m['early_max_share']:.2f}",
                     f"{m['ratio']:.2f}"])
    parts = list(result.get("_sections") or [])
    ds = sorted((m for m in models.values() if m["kind"] in ("data-scale", "own")), key=lambda m: m["size"] or 0)
    if len(ds) >= 2:
        xs = [m["size"] for m in ds]
        lines = {"pos-emb near minus far": (xs, [m.get("pos_neighbour_minus_far", 0.0) for m in ds]),
                 "distance rise (share of uniform)": (xs, [m["distance_rise"] for m in ds]),
                 "widest early head (share)": (xs, [m["early_max_share"] for m in ds]),
                 "filters low-frequency share": (xs, [m.get("filters_low_frequency", 0.0) for m in ds])}
        fig = lines_plot([("The patterns against training data (same steps)", lines)],
                         xlabel="training images", ylabel="measure", logx=True, percent=False)
        parts.append(Section("patterns_vs_data", "Why: the patterns against training data",
                             "Each measure of the findings for the data-scale ViTs (the same steps on 1k to 60k "
                             "images).", png_bytes(fig), {"sizes": xs, "lines": {k: v[1] for k, v in lines.items()}}))
    return [("The measures per model", header, rows)], parts


TITLE = "vitlab reproduce inside: what the trained ViT looks like inside (Sec. 4.5, Fig. 6-7)"
