"""An experiment's report: `result.json` (every number), one PNG per figure and `report.html`, a self-contained page
(the PNGs inlined, as `vitlab analyze`'s page: `vitlab.analysis.page`) with the paper's claims beside our
measurements at the top. `vitlab demo`'s page is one too (`vitlab.paper.demo_page`; its numbers in demo.json).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.page import Section
from ..utils.io import write_atomic

__all__ = ["VERDICTS", "Claim", "Section", "png_bytes", "write_report"]

VERDICTS = ("yes", "no", "partly", "within noise")

STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}img{max-width:100%}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;"
         "vertical-align:top}.yes{color:#070}.no{color:#a00}.partly{color:#a60}.noise{color:#555}")


@dataclass
class Claim:
    """One statement of the paper and what we measured.

    Attributes:
        paper: The paper's claim, with its section / figure / table.
        measured: Our measurement, in words with its numbers.
        verdict: "yes" (reproduced: 2 standard errors above the bar), "no" (2 below), "within noise" (neither) or
            "partly" (a claim tested at several settings, with different verdicts; `vitlab.paper.stats`).
        numbers: The numbers behind the verdict (shown on the page, kept in result.json).
    """

    paper: str
    measured: str
    verdict: str
    numbers: dict[str, Any]

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"paper": self.paper, "measured": self.measured, "verdict": self.verdict, "numbers": self.numbers}


def png_bytes(fig: Any) -> bytes:
    """A matplotlib Figure as PNG bytes (closed afterwards)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def fmt(v: Any) -> str:
    """How the page prints a number: percentages for accuracies are formatted by the caller; floats to 3 digits."""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def html_page(title: str, intro: str, claims: list[Claim], tables: list[tuple[str, list[str], list[list[str]]]],
              parts: list[Section]) -> str:
    """The page: title, intro, the claims table, the results tables, then each figure with its caption."""
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", f"<p>{esc(intro)}</p>",
            "<h2>The paper's claim and our measurement</h2>",
            "<table><tr><th>paper</th><th>measured here</th><th>reproduced</th><th>numbers</th></tr>"]
    for c in claims:
        nums = ", ".join(f"{k}={fmt(v)}" for k, v in c.numbers.items() if not isinstance(v, list | dict))
        body.append(f"<tr><td>{esc(c.paper)}</td><td>{esc(c.measured)}</td>"
                    f"<td class='{c.verdict}'><b>{c.verdict}</b></td><td>{esc(nums)}</td></tr>")
    body.append("</table>")
    for caption, header, rows in tables:
        body.append(f"<h2>{esc(caption)}</h2><table><tr>{''.join(f'<th>{esc(h)}</th>' for h in header)}</tr>")
        body += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
        body.append("</table>")
    for sec in parts:
        b64 = base64.b64encode(sec.png).decode()
        body.append(f'<h2 id="{esc(sec.stem)}">{esc(sec.title)}</h2><p>{esc(sec.caption)} Numbers: '
                    f'<code>{esc(sec.stem)}.json</code>.</p>'
                    f'<img alt="{esc(sec.title)}" src="data:image/png;base64,{b64}">')
    # an empty data: icon: no request for /favicon.ico (a console error when the page is served over HTTP)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'>"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def write_report(out_dir: Path, *, title: str, intro: str, claims: list[Claim],
                 tables: list[tuple[str, list[str], list[list[str]]]], parts: list[Section],
                 result: dict[str, Any], result_name: str = "result.json") -> Path:
    """Write `result_name` (every number of `result`, with the claims), each figure's PNG and JSON, and report.html;
    returns report.html's path. Files are replaced: the report always shows the experiment's current state."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for sec in parts:
        write_atomic(out_dir / f"{sec.stem}.png", sec.png, overwrite=True)
        write_atomic(out_dir / f"{sec.stem}.json", json.dumps(finite(sec.data), indent=1), overwrite=True)
    full = {**{k: v for k, v in result.items() if not k.startswith("_")}, "claims": [c.to_dict() for c in claims]}
    write_atomic(out_dir / result_name, json.dumps(finite(full), indent=2, allow_nan=False), overwrite=True)
    page = out_dir / "report.html"
    write_atomic(page, html_page(title, intro, claims, tables, parts), overwrite=True)
    return page


def finite(x: Any) -> Any:
    """`x` with every NaN / infinity replaced by None (strict JSON has neither; a rank correlation of a constant is
    NaN), and Paths and tuples made JSON-ready."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def pct(x: float | None) -> str:
    """An accuracy in [0, 1] as "91.2%" (or "-" when missing)."""
    return "-" if x is None else f"{100 * x:.1f}%"
