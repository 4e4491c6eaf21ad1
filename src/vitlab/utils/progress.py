"""One progress-bar policy for the library: tqdm on stderr, only when asked for and stderr is a terminal (never
in logs, pipes or CI output)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["progress_bar", "wants_progress"]


def wants_progress(enabled: bool = True) -> bool:
    """True when a bar was asked for and stderr is an interactive terminal."""
    return bool(enabled) and sys.stderr.isatty()


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **kwargs: Any) -> Any:
    """`tqdm(iterable, **kwargs)` on stderr, disabled (a silent pass-through) unless `wants_progress(enabled)`."""
    from tqdm.auto import tqdm

    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    return tqdm(iterable, file=sys.stderr, disable=not wants_progress(enabled), **kwargs)
