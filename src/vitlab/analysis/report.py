"""The paper's figures as PNG, their numbers as JSON, and one self-contained HTML page.

`analyze(model, images)` computes everything (returning arrays); `write_report(result, out_dir)` draws and
writes it. Figures follow the paper: Fig. 7 left (filters), centre (position-embedding similarity), right
(mean attention distance), Fig. 6 (attention rollout). Files are written atomically and never replace
existing ones unless asked to.

The work is split by job: `findings` (the numbers and the paper's statements), `plots` (matplotlib Figures),
`page` (each figure's caption and numbers, and the HTML); this module writes the files.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..utils.io import write_atomic
from .findings import (
    GLOBAL_FRACTION,
    GROWTH_FRACTION,
    LOCAL_FRACTION,
    POS_GAP,
    AnalysisResult,
    analyze,
    display_images,
    findings,
)
from .page import Section, html_page, sections
from .plots import (
    plot_attention_distance,
    plot_filters,
    plot_layer_maps,
    plot_pos_similarity,
    plot_rollout,
    plot_token_stats,
    similarity_mosaic,
)

__all__ = [
    "GLOBAL_FRACTION",
    "GROWTH_FRACTION",
    "LOCAL_FRACTION",
    "POS_GAP",
    "AnalysisResult",
    "Section",
    "analyze",
    "display_images",
    "findings",
    "html_page",
    "plot_attention_distance",
    "plot_filters",
    "plot_layer_maps",
    "plot_pos_similarity",
    "plot_rollout",
    "plot_token_stats",
    "report_files",
    "sections",
    "similarity_mosaic",
    "write_report",
]


def report_files(result: AnalysisResult) -> list[str]:
    """Names of the files `write_report` writes for `result`."""
    names = ["attention_distance", "attention_rollout"]
    if result.attention.rollout_dist is not None:
        names.append("attention_rollout_distillation")
    if result.attention.tokens is not None:
        names.append("prefix_tokens")
    if result.filters is not None:
        names.insert(0, "filters")
    if result.pos_similarity is not None:
        names.insert(1, "posembed_similarity")
    names += [f"attention_layer{i + 1}" for i in sorted(result.attention.layer_maps)]
    return [f"{n}.{ext}" for n in names for ext in ("png", "json")] + ["findings.json", "report.html"]


def write_report(result: AnalysisResult, out_dir: str | Path, overwrite: bool = False) -> list[Path]:
    """Write each figure as PNG, its numbers as JSON, and report.html with the PNGs inlined.

    Raises:
        FileExistsError: one of the files exists and `overwrite` is False (nothing is written then).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {out} exists and is not a directory")
    if not overwrite:
        clash = [n for n in report_files(result) if (out / n).exists()]
        if clash:
            raise FileExistsError(f"{out} already holds {', '.join(clash)}; pass --force to replace them")
    out.mkdir(parents=True, exist_ok=True)
    parts = sections(result)  # every figure drawn before the first file is written
    written = []
    for sec in parts:
        write_atomic(out / f"{sec.stem}.png", sec.png, overwrite=overwrite)
        write_atomic(out / f"{sec.stem}.json", json.dumps(sec.data).encode(), overwrite=overwrite)
        written += [out / f"{sec.stem}.png", out / f"{sec.stem}.json"]
    meta = {"source": result.source, "config": result.config, "num_images": len(result.images),
            "findings": result.findings}
    write_atomic(out / "findings.json", json.dumps(meta, indent=2).encode(), overwrite=overwrite)
    write_atomic(out / "report.html", html_page(result, parts).encode(), overwrite=overwrite)
    return [*written, out / "findings.json", out / "report.html"]
