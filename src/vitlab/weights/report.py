"""What a weight load did: the report `load_weights` returns, and the errors and warnings it raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded into the model as asked (the message says why and what to do)."""


@contextlib.contextmanager
def bad_transformers_config(source: str) -> Iterator[None]:
    """Within the block, reading a transformers config.json (`source`), a value of the wrong type or form
    (TypeError, ValueError, KeyError, AttributeError) is raised as WeightsError naming the file; a WeightsError
    passes as it is."""
    try:
        yield
    except WeightsError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise WeightsError(f"{source}: bad transformers config.json: {type(e).__name__}: {e}") from e


class ShapeMismatchError(WeightsError):
    """A tensor whose shape differs from the model's in a way no resampling or head replacement resolves."""


class WeightsWarning(UserWarning):
    """Something about a checkpoint the user should know: a dropped pre-logits layer, an all-zero head."""


@dataclass
class LoadReport:
    """The outcome of one `load_weights` / `load_model` call.

    Attributes:
        source: The file or directory read.
        format: "vitlab", "npz", "big_vision", "timm", "hf" or "torchvision".
        loaded: Model parameter names filled from the checkpoint.
        resampled: Parameter name -> "old shape -> new shape (mode)" for resampled position embeddings.
        replaced: Parameters kept at their fresh (zero) initialisation because the checkpoint's differ in shape
            (a head with another class count).
        dropped: Checkpoint tensors not used (e.g. pre-logits for a model without one).
        missing: Model parameters the checkpoint did not provide (left as initialised).
        unexpected: Checkpoint tensors with no place in the model (only with `strict=False`).
        inferred: Config fields inferred from the checkpoint (by `load_model`), field -> value.
        sources: Where each architecture field's value came from (by `load_model`), field -> "config.json
            model_args", "tensor shapes", "load_model argument", ...
        messages: Human-readable notes, one per event.
    """

    source: str
    format: str
    loaded: list[str] = field(default_factory=list)
    resampled: dict[str, str] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    inferred: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every model parameter came from the checkpoint unchanged in meaning."""
        return not (self.missing or self.unexpected or self.replaced)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors from {self.source} ({self.format})"]
        for name, what in self.resampled.items():
            lines.append(f"  resampled {name}: {what}")
        for title, names in (("replaced", self.replaced), ("dropped", self.dropped), ("missing", self.missing),
                             ("unexpected", self.unexpected)):
            if names:
                lines.append(f"  {title} ({len(names)}): {', '.join(names)}")
        if self.inferred:
            lines.append("  inferred: " + ", ".join(f"{k}={v}" for k, v in self.inferred.items()))
        if self.sources:
            by: dict[str, list[str]] = {}
            for k, where in self.sources.items():
                by.setdefault(where, []).append(k)
            lines.append("  fields from: " + "; ".join(f"{where}: {', '.join(ks)}" for where, ks in by.items()))
        lines.extend(f"  note: {m}" for m in self.messages)
        return "\n".join(lines)
