"""Inside the model (paper Sec. 4.5, Fig. 6-7) on the longest-trained ViT of the other experiments: the
patch-embedding filters, the position-embedding similarity, the mean attention distance per head against depth, and
attention rollout, each with a measured statement of whether the paper's pattern appears
(`vitlab.analysis.findings` plus two measures defined here: the filters' low-frequency energy against the same model
at initialisation, and the rollout's mass on the garment against its area).

The model analysed is the 28 px ViT that saw the most training images: a data-scale ViT (OUT/data-scale/vit-*) or
transfer's upstream ViT (OUT/upstream); without any, this experiment trains one itself (OUT/inside/vit). The
data-scale ViTs (the same model trained to convergence on 1 k to 58.8 k images, at similar step counts) test the
published explanation of a missing pattern: Raghu et al. 2021 ("Do Vision Transformers See Like Convolutional
Neural Networks?", Sec. 4 and Fig. 5) find that ViTs trained on less data (ImageNet rather than JFT-300M) do not
learn the local attention heads of the lower layers; measured here as the lowest layer's attention distance
against the training-set size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..analysis.filters import filter_pca
from ..analysis.findings import _spearman, analyze
from ..analysis.page import sections
from ..data import DataConfig, build_eval_data
from ..weights import create_model, load_model
from .figures import lines_plot
from .recipes import data_section, model_section, pretrain_recipe
from .report import Claim, Section, pct, png_bytes
from .subrun import finished, run_or_resume
from .upstream import DIR, UPSTREAM_CLASSES

NAME = "inside"
LOW_FREQ_MARGIN = 0.1  # the filters count as smooth when their low-frequency share beats random filters' by this
OBJECT_RATIO = 1.1  # rollout counts as "on the object" when its mass there exceeds the object's area share by 10%
# The paper's statement behind each of `vitlab.analysis.findings` (`vitlab demo`'s page states them too)
FINDINGS = {
    "pos_embed_2d": "Fig. 7 centre: the position embeddings learn the 2-D image topology: closer patches have more "
                    "similar embeddings, with a row-column structure",
    "distance_grows_with_depth": "Fig. 7 right: the attention distance increases with network depth",
    "early_local_and_global": "Fig. 7 right: some heads attend to most of the image already in the lowest layers, "
                              "others stay local",
}
TREND_MARGIN = 0.05  # Raghu et al.'s trend counts when the most local low-layer head moves by 5% of uniform's distance


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
    """Finished 28 px ViT runs of the other experiments: {"name", "run_dir", "top1", "kind", "size", "steps",
    "images_seen", "classes"}; "size" is the training-set size of the data-scale runs."""

    def report(run_dir: Path) -> dict[str, Any]:
        return json.loads((run_dir / "report.json").read_text(encoding="utf-8"))

    found = []
    seed0 = [p for p in (out / "data-scale").glob("vit-*") if "-seed" not in p.name]  # other seeds: the same runs
    for run_dir in sorted(seed0, key=lambda p: int(p.name.split("-")[1])):
        if finished(run_dir):
            r = report(run_dir)
            found.append({"name": f"data-scale/{run_dir.name}", "run_dir": run_dir, "top1": r["final"]["top1"],
                          "kind": "data-scale", "size": int(run_dir.name.split("-")[1]), "steps": r["step"],
                          "images_seen": r["images_seen"], "best_step": r.get("best_step"), "classes": None})
    if finished(out / DIR):
        r = report(out / DIR)
        found.append({"name": DIR, "run_dir": out / DIR, "top1": r["final"]["top1"], "kind": "upstream",
                      "size": None, "steps": r["step"], "images_seen": r["images_seen"], "best_step": None,
                      "classes": UPSTREAM_CLASSES})
    return found


def _images(model: Any, quick: bool, n: int, classes: list[int] | None = None):
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
    share = att.mean_distance / att.uniform_distance  # (L, heads): each head's distance, share of uniform's
    out = {"grid": list(att.grid), "uniform_distance": att.uniform_distance, **extra,
           "head_distance_share": share.tolist(), "lowest_layer_min_share": float(share[0].min()),
           "lowest_layer_mean_share": float(share[0].mean())}
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


def run(out: Path, *, quick: bool = False, budget_min: float | None = None, progress: bool = False,
        seeds: int = 1) -> dict[str, Any]:
    del budget_min, seeds  # analysis only (of seed 0's ViTs), unless a ViT must be trained (then the setting's steps)
    s = Settings.for_run(quick)
    found = _candidates(out)
    runs: dict[str, dict[str, Any]] = {}
    if not found:
        recipe = pretrain_recipe(model_section("vit", quick), data_section(quick), steps=s.steps,
                                 batch_size=s.batch_size, warmup=s.warmup)
        r = run_or_resume("vit", recipe, out / NAME / "vit", progress=progress)
        runs["vit"] = r.to_dict()
        found.insert(0, {"name": "inside/vit", "run_dir": Path(r.run_dir), "top1": r.top1, "kind": "own",
                         "size": None, "steps": r.steps, "images_seen": r.images_seen, "best_step": None,
                         "classes": None})
    best = max(found, key=lambda c: (c["images_seen"], c["top1"]))  # the longest-trained
    depth_maps = (0, -1)
    models: dict[str, dict[str, Any]] = {}
    best_result = None
    for c in [best, *[c for c in found if c is not best]]:
        res, extra = _analyze(c["run_dir"], quick, s.num_images, depth_maps if c is best else (), c["classes"])
        best_result = best_result or res
        models[c["name"]] = {k: c[k] for k in ("top1", "kind", "size", "steps", "images_seen", "best_step")}
        models[c["name"]].update(_summary(res, extra))
    assert best_result is not None
    parts = sections(best_result)
    return {"experiment": NAME, "settings": s.__dict__, "runs": runs, "best": best["name"], "models": models,
            "_sections": parts}


def data_trend(result: dict[str, Any]) -> dict[str, Any] | None:
    """Raghu et al.'s test on the data-scale ViTs: the lowest layer's attention distance (each head's mean distance
    as a share of uniform attention's; the most local head and the mean of the heads) against the training-set
    size, with the Spearman rank correlation of each with the size. None with fewer than two such ViTs."""
    ds = sorted((m for m in result["models"].values() if m["kind"] == "data-scale"), key=lambda m: m["size"])
    if len(ds) < 2:
        return None
    sizes = np.array([m["size"] for m in ds], dtype=np.float64)
    mins = np.array([m["lowest_layer_min_share"] for m in ds])
    means = np.array([m["lowest_layer_mean_share"] for m in ds])
    return {"sizes": sizes.astype(int).tolist(), "steps": [m["steps"] for m in ds], "min_share": mins.tolist(),
            "mean_share": means.tolist(), "spearman_min": _spearman(sizes, mins),
            "spearman_mean": _spearman(sizes, means)}


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

    def finding(key: str, measured: str, because: str, numbers: dict[str, Any]) -> None:
        """One of `vitlab.analysis.findings` as a claim (`FINDINGS`); where it does not hold, `because` follows."""
        ok = bool(m["findings"].get(key, False))
        out.append(Claim(paper=FINDINGS[key], measured=measured + ("" if ok else f"; {because}"),
                         verdict="yes" if ok else "no", numbers=numbers))

    if "pos_neighbour_minus_far" in m:
        finding("pos_embed_2d", f"neighbour minus far-pair cosine similarity {m['pos_neighbour_minus_far']:.3f}, "
                                f"correlation with grid distance {m['pos_correlation']:.3f}", why["pos"],
                {"neighbour_minus_far": m["pos_neighbour_minus_far"], "correlation": m["pos_correlation"]})
    finding("distance_grows_with_depth",
            f"last-third minus first-third layer mean distance {100 * m['distance_rise']:+.0f}% of uniform "
            f"attention's, Spearman(layer, distance) {m['distance_spearman']:.2f}", why["depth"],
            {"distance_rise": m["distance_rise"], "spearman": m["distance_spearman"]})
    finding("early_local_and_global",
            f"lowest layers' heads span {100 * m['early_min_share']:.0f}% to {100 * m['early_max_share']:.0f}% of "
            "uniform attention's distance (local below 25%, global above 75%)",
            "Raghu et al. 2021 explain missing local heads by too little training data: tested in the next row",
            {"early_min_share": m["early_min_share"], "early_max_share": m["early_max_share"]})
    trend = data_trend(result)
    if trend is not None:
        falls = trend["spearman_min"] < 0 and trend["min_share"][-1] < trend["min_share"][0] - TREND_MARGIN
        series = ", ".join(f"{n:,}: {100 * a:.0f}% ({100 * b:.0f}%)"
                           for n, a, b in zip(trend["sizes"], trend["min_share"], trend["mean_share"]))
        out.append(Claim(
            paper="Raghu et al. 2021 (Sec. 4, Fig. 5), the published explanation of missing local heads: ViTs "
                  "trained on less data learn less local attention in their lowest layers",
            measured=f"the lowest layer's most local head (and its mean over heads) as a share of uniform "
                     f"attention's distance, by training images: {series}; Spearman with the size "
                     f"{trend['spearman_min']:.2f} ({trend['spearman_mean']:.2f}); a fall counts beyond "
                     f"{100 * TREND_MARGIN:.0f} points of share",
            verdict="yes" if falls and trend["spearman_min"] <= -0.8 else ("partly" if falls else "no"),
            numbers={"spearman_min": trend["spearman_min"], "spearman_mean": trend["spearman_mean"],
                     "min_share_smallest": trend["min_share"][0], "min_share_largest": trend["min_share"][-1]}))
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
    """For each pattern, the same measure on the data-scale ViTs (trained on 1 k to 58.8 k images)."""
    ds = sorted((v for v in result["models"].values() if v["kind"] == "data-scale"), key=lambda v: v["size"])

    def explain(key: str, what: str, fmt: str = "{:.2f}") -> str:
        vals = [(r["size"], r[key]) for r in ds if key in r]
        if len(vals) < 2:
            return "no other ViT to compare (run data-scale first)"
        return f"{what} against training images: " + ", ".join(f"{n:,}: {fmt.format(v)}" for n, v in vals)

    return {"filters": explain("filters_low_frequency", "low-frequency share"),
            "pos": explain("pos_neighbour_minus_far", "neighbour minus far similarity", "{:.3f}"),
            "depth": explain("distance_rise", "distance rise")}


def tables_and_figures(result: dict[str, Any]) -> tuple[list, list[Section]]:
    models = result["models"]
    header = ["model", "training images seen (steps)", "test top-1", "filters low-freq (init, random)",
              "pos-emb near-far", "distance rise", "lowest layer: heads (share of uniform)", "rollout on object"]
    rows = []
    for name, m in models.items():
        lf = (f"{m['filters_low_frequency']:.2f} ({m['filters_low_frequency_init']:.2f}, "
              f"{m['filters_low_frequency_random']:.2f})"
              if "filters_low_frequency" in m else "-")
        heads = ", ".join(f"{h:.2f}" for h in sorted(m["head_distance_share"][0]))
        rows.append([name + (" (analysed)" if name == result["best"] else ""),
                     f"{m['images_seen']:,} ({m['steps']})", pct(m["top1"]), lf,
                     f"{m.get('pos_neighbour_minus_far', float('nan')):.3f}", f"{m['distance_rise']:+.2f}", heads,
                     f"{m['ratio']:.2f}"])
    parts = list(result.get("_sections") or [])
    trend = data_trend(result)
    if trend is not None:
        ds = sorted((m for m in models.values() if m["kind"] == "data-scale"), key=lambda m: m["size"])
        xs = trend["sizes"]
        lines = {"lowest layer: most local head": (xs, trend["min_share"]),
                 "lowest layer: mean of heads": (xs, trend["mean_share"]),
                 "distance rise with depth": (xs, [m["distance_rise"] for m in ds]),
                 "pos-emb near minus far": (xs, [m.get("pos_neighbour_minus_far", 0.0) for m in ds])}
        fig = lines_plot([("The patterns against training data (Raghu et al. 2021's test)", lines)],
                         xlabel="training images", ylabel="share of uniform attention's distance / measure",
                         logx=True, percent=False)
        parts.append(Section("patterns_vs_data", "Why: local attention in the lowest layer against training data",
                             "The data-scale ViTs (one architecture trained to convergence on 1k to 58.8k images): "
                             "each head's mean attention distance in the lowest layer as a share of uniform "
                             "attention's (below 25%: local), and the other measures, against the training-set "
                             "size. Raghu et al. 2021 find fewer local low-layer heads with less data.",
                             png_bytes(fig), {"trend": trend, "lines": {k: v[1] for k, v in lines.items()}}))
    return [("The measures per model", header, rows)], parts


TITLE = "vitlab reproduce inside: what the trained ViT looks like inside (Sec. 4.5, Fig. 6-7)"
