"""Read any checkpoint vitlab loads and write it for vitlab or another library: the library side of
`vitlab convert`.

    from vitlab.weights import convert
    result = convert("ViT-B_16.npz", "vit_b_16.pth", to="torchvision")
    print(result.summary())       # what was read (format, inferred fields), what was written, how to load it
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.progress import progress_bar
from .api import load_model, read_metadata
from .publish import EXPORT_FORMATS, export

if TYPE_CHECKING:
    from ..models.vit import VisionTransformer
    from .report import LoadReport

__all__ = ["ConvertResult", "convert", "format_from_suffix"]


@dataclass
class ConvertResult:
    """What `convert` read and wrote."""

    path: Path  # the file or (for "hf") directory written
    format: str  # one of EXPORT_FORMATS
    model: VisionTransformer  # the model as loaded from the source
    report: LoadReport  # how the source was read: its format, inferred fields, resampling
    notes: list[str] = field(default_factory=list)  # how to load the output, what differs from the source

    def summary(self) -> str:
        """The load report, one line on what was written, then the notes (what `vitlab convert` prints)."""
        c = self.model.cfg
        params = sum(p.numel() for p in self.model.parameters())
        lines = [str(self.report),
                 f"wrote {self.path} ({self.format}): embed_dim={c.embed_dim} depth={c.depth} "
                 f"num_heads={c.num_heads} patch_size={c.patch_size} img_size={c.img_size} "
                 f"num_classes={c.num_classes}, {params:,} parameters"]
        return "\n".join(lines + [f"  {n}" for n in self.notes])


def format_from_suffix(dst: str | Path) -> str:
    """"vitlab" for a .safetensors destination, "npz" for .npz; ValueError otherwise (pass `to`)."""
    suffix = Path(dst).suffix
    if suffix == ".safetensors":
        return "vitlab"
    if suffix == ".npz":
        return "npz"
    raise ValueError(f"cannot tell the format of {dst}: use a .safetensors (vitlab) or .npz (Google) suffix, or "
                     f"--to {{{','.join(EXPORT_FORMATS)}}}")


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    to: str | None = None,
    force: bool = False,
    pos_embed_resize: str | None = None,
    progress: bool = False,
    hf_model_type: str | None = None,
    **overrides: Any,
) -> ConvertResult:
    """Convert the checkpoint `src` into `dst` in format `to`, carrying the source's metadata where `to` holds it.

    Args:
        src: Anything `load_model` reads: a file, a folder, a registry name, `hf-hub:owner/repo`, a URL.
        dst: The output file, or for `to="hf"` a directory (new, or empty).
        to: One of `vitlab.weights.publish.EXPORT_FORMATS`; default: from `dst`'s suffix (`format_from_suffix`).
        force: Replace `dst` if it exists.
        pos_embed_resize: Resampling mode for `img_size` overrides (default: "jax" for .npz sources, else bicubic).
        progress: A two-step progress bar (read, write) on stderr when stderr is a terminal.
        hf_model_type: For `to="hf"`, the transformers model_type to write (default: the one that computes the
            model; "vit_mae" writes a ViTMAEModel; see `vitlab.weights.hf_families.model_type_for`).
        **overrides: ViTConfig fields changed while loading, e.g. `img_size=384`, `num_classes=10`, `num_heads=12`.

    Returns:
        A ConvertResult; `.summary()` is the text `vitlab convert` prints.

    Raises:
        FileExistsError: `dst` exists and `force` is False.
        ValueError: `src` and `dst` are the same file, or `to` cannot be told from the suffix.
        vitlab.weights.WeightsError: `src` cannot be read, or `to`'s library cannot compute this model.
    """
    dst = Path(dst)
    to = to or format_from_suffix(dst)
    if dst.exists() and not force and not (to == "hf" and dst.is_dir() and not any(dst.iterdir())):
        raise FileExistsError(f"{dst} already exists; pass --force (force=True) to replace it")
    if os.path.exists(src) and dst.exists() and Path(src).resolve() == dst.resolve():
        raise ValueError(f"source and destination are the same file: {src}")
    with progress_bar(total=2, desc="convert", unit="step", enabled=progress) as bar:
        bar.set_postfix_str(f"reading {src}")
        model, report = load_model(src, pos_embed_resize=pos_embed_resize, return_report=True, **overrides)
        bar.update()
        bar.set_postfix_str(f"writing {dst}")
        meta = {**read_metadata(src), "converted_from": {"path": str(src), "format": report.format}}
        _, notes = export(model, dst, to, metadata=meta, overwrite=force, hf_model_type=hf_model_type)
        bar.update()
    return ConvertResult(dst, to, model, report, list(notes))
