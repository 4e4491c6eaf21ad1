"""The report's content and its HTML page: for each figure a heading, a caption, the PNG and the numbers behind
it (`sections`), and one self-contained page with the findings table and every PNG inlined (`html_page`)."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import plots
from .findings import AnalysisResult
from .posembed_sim import similarity_by_distance


@dataclass
class Section:
    """One figure of the report.

    Attributes:
        stem: File name without extension (`{stem}.png`, `{stem}.json`) and the page anchor.
        title: Heading, naming the paper's figure.
        caption: What the figure shows and how it was computed.
        png: The drawn figure.
        data: The figure's numbers, written as `{stem}.json`.
    """

    stem: str
    title: str
    caption: str
    png: bytes
    data: dict[str, Any]


def sections(result: AnalysisResult) -> list[Section]:
    """Every figure `result` has, drawn, in the page's order: filters, position embeddings, attention distance,
    rollout (and the distillation token's for a DeiT model), the prefix tokens, then the per-layer maps."""
    att = result.attention
    out: list[Section] = []
    if result.filters is not None:
        out.append(Section(
            "filters", "Patch-embedding filters (Fig. 7 left)",
            "Top principal components of the patch projection E, each shown as a P x P image.",
            _png(plots.plot_filters(result.filters)),
            {"components": _tolist(result.filters.components),
             "explained_variance": _tolist(result.filters.explained_variance),
             "explained_variance_ratio": _tolist(result.filters.explained_variance_ratio),
             "shape": "(K, C, P, P)"}))
    if result.pos_similarity is not None:
        out.append(Section(
            "posembed_similarity", "Position-embedding similarity (Fig. 7 centre)",
            "Tile (row i, column j): cosine similarity of patch (i, j)'s position embedding to every patch's, in "
            "the grid's layout.",
            _png(plots.plot_pos_similarity(result.pos_similarity)),
            {"similarity": _tolist(result.pos_similarity, 5), "shape": "(gh, gw, gh, gw)",
             **similarity_by_distance(result.pos_similarity)}))
    out.append(Section(
        "attention_distance", "Mean attention distance (Fig. 7 right)",
        f"Attention-weighted mean pixel distance between patch queries and patch keys (the "
        f"{_prefix_words(result.config)} left out), "
        f"averaged over {len(result.images)} images; dashed: uniform attention ({att.uniform_distance:.1f} px).",
        _png(plots.plot_attention_distance(att.mean_distance, att.uniform_distance)),
        {"mean_distance": _tolist(att.mean_distance), "std_over_images": _tolist(att.distance_per_image.std(0)),
         "shape": "(layers, heads)", "units": "pixels of the model input",
         "uniform_attention_distance": att.uniform_distance, "patch_size": att.patch_size,
         "grid": list(att.grid), "num_images": len(result.images)}))
    out.append(Section(
        "attention_rollout", "Attention rollout (Fig. 6)",
        "Input, input weighted by the rollout of attention through all layers (heads averaged, identity added, "
        "rows renormalised), and the rollout map; "
        + ("from the class token." if result.config.get("class_token") else
           "mean over the patch queries (no class token)."),
        _png(plots.plot_rollout(result.images, att.rollout)),
        {"maps": _tolist(att.rollout), "shape": "(n, gh, gw)", "grid": list(att.grid)}))
    if att.rollout_dist is not None:
        out.append(Section(
            "attention_rollout_distillation", "Attention rollout of the distillation token (DeiT)",
            "The same rollout read from the distillation token's row: what the head trained on the teacher's "
            "labels reads from each patch.",
            _png(plots.plot_rollout(result.images, att.rollout_dist)),
            {"maps": _tolist(att.rollout_dist), "shape": "(n, gh, gw)", "grid": list(att.grid)}))
    if att.tokens is not None:
        t = att.tokens
        out.append(Section(
            "prefix_tokens", "Prefix tokens: class, distillation, registers vs patches",
            f"Per layer: how the {t.query}'s attention (heads averaged) splits over the kinds of key, and the mean "
            f"output norm of each kind of token; dashed: the share of patch tokens whose norm exceeds "
            f"{t.outlier_factor:g}x the median patch norm (the high-norm artifact tokens registers absorb, Darcet et "
            f"al. 2024). Last layer: largest patch norm {t.max_norm_ratio[-1]:.2f}x the median.",
            _png(plots.plot_token_stats(t)), t.to_dict()))
    for i in sorted(att.layer_maps):
        out.append(Section(
            f"attention_layer{i + 1}", f"Layer {i + 1}, each head",
            "Attention of the class token (or mean patch query) to each patch, per head.",
            _png(plots.plot_layer_maps(result.images, att.layer_maps[i], i)),
            {"maps": _tolist(att.layer_maps[i]), "shape": "(n, heads, gh, gw)", "layer": i}))
    return out


def _prefix_words(cfg: dict[str, Any]) -> str:
    """"class token", "class and distillation tokens and 4 registers", ... for a config dict."""
    parts = [w for w, on in (("class", cfg.get("class_token")), ("distillation", cfg.get("distilled"))) if on]
    words = " and ".join(parts) + (" token" + ("s" if len(parts) > 1 else "") if parts else "")
    reg = int(cfg.get("reg_tokens") or 0)
    if reg:
        words = f"{words} and {reg} registers" if words else f"{reg} registers"
    return words or "no prefix tokens"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _tolist(x: np.ndarray, decimals: int = 6) -> list:
    return np.round(np.asarray(x, dtype=np.float64), decimals).tolist()


def html_page(result: AnalysisResult, parts: list[Section]) -> str:
    """One self-contained HTML page: the findings table, then each section's heading, caption and inlined PNG."""
    esc = html.escape
    rows = []
    for name, f in result.findings.items():
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in f.items() if k != "yes" and not isinstance(v, list))
        rows.append(f"<tr><td>{esc(name)}</td><td><b>{'yes' if f['yes'] else 'no'}</b></td><td>{esc(nums)}</td></tr>")
    cfg = result.config
    body = [
        f"<h1>vitlab analyze: {esc(result.source or cfg.get('name') or 'model')}</h1>",
        f"<p>{esc(str(cfg.get('name') or ''))} img_size={esc(str(cfg['img_size']))} patch={cfg['patch_size']} "
        f"D={cfg['embed_dim']} depth={cfg['depth']} heads={cfg['num_heads']} pos_embed={esc(cfg['pos_embed'])} "
        f"pool={esc(cfg['pool'])}; {len(result.images)} images.</p>",
        "<h2>What the paper describes (Sec. 4.5)</h2><table><tr><th>finding</th><th>holds</th><th>numbers</th></tr>",
        *rows,
        "</table>",
    ]
    return document("vitlab analyze", body, parts)


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}img{max-width:100%}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}")


def document(title: str, body: list[str], parts: list[Section], numbers: str | None = None) -> str:
    """A self-contained HTML page: the `body` HTML fragments, then each section's heading, caption (naming the JSON
    file of its numbers: `numbers`, else `{stem}.json`) and inlined PNG."""
    esc = html.escape
    out = list(body)
    for sec in parts:
        b64 = base64.b64encode(sec.png).decode()
        out.append(f'<h2 id="{sec.stem}">{esc(sec.title)}</h2><p>{esc(sec.caption)} Numbers: '
                   f'<code>{esc(numbers or sec.stem + ".json")}</code>.</p>'
                   f'<img alt="{esc(sec.title)}" src="data:image/png;base64,{b64}">')
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(out)}</body></html>")


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
