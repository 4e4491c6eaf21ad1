"""What a reader of a foreign layout (OpenCLIP, DINOv2) hands to `vitlab.weights.checkpoint`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import preprocess as pp


@dataclass(frozen=True)
class Unfixed:
    """A `Converted.known` value for a field the file does not fix; `vitlab.weights.infer` refuses it by name."""

    why: str


@dataclass
class Converted:
    """A foreign checkpoint in our names and what it says about the architecture.

    Attributes:
        state: Tensors in our (timm's) names.
        known: ViTConfig fields fixed by the file (its config, its tensors, or its family's published table).
        sources: Field -> where its value came from, for the load report.
        preprocess: The input preprocessing, when the file's config or its family's convention states it.
        default_resize: The position-embedding resampling mode of the source library.
    """

    state: dict[str, torch.Tensor]
    known: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    preprocess: pp.Preprocess | None = None
    default_resize: str = "bicubic"

    def unfixed(self, name: str, why: str) -> None:
        """Record that the file does not fix config field `name` (`why` says what the candidates are): loading
        refuses, naming it, unless the caller passes it or a config beside the file states it."""
        self.known[name] = Unfixed(why)

    def fix(self, name: str, value: Any, source: str) -> None:
        """Record that the file fixes config field `name` to `value`, and where that came from."""
        self.known[name] = value
        self.sources[name] = source

    def fix_all(self, fields: dict[str, Any], where: dict[str, str]) -> None:
        """`fix` each of `fields`, with where it came from (`where[name]`)."""
        for name, value in fields.items():
            self.fix(name, value, where[name])
