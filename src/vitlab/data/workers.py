"""What the file-backed datasets (image folders, WebDataset shards) share: their batches come from DataLoader
worker processes, each batch with the bad samples met while making it, and the workers are stopped as soon as
the stream is done with them (not whenever the garbage collector gets to it).

A worker yields `(images, labels, notes)`, notes being `(where, reason)` pairs; `BadSamples` warns about
them (the first MAX_WARNINGS, then once with a count) and records them in the data's report.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from .images import BadImageWarning
from .position import Position
from .stream import Batch, EvalData, TrainStream, one_thread

MAX_WARNINGS = 20  # individual warnings per scan / stream; the rest are summarised and all are in the report
MAX_REPORTED = 100  # skipped files listed in report.json (all of them are counted)
BAD_KEYS = ("skipped", "dropped_at_load", "replaced_at_load")  # the reports' lists of {"path", "reason"}


def skipped_summary(report: dict[str, Any] | None) -> dict[str, Any]:
    """The bad files of a data report, for report.json: {"num_skipped": all of them, "skipped": the first
    MAX_REPORTED {"path", "reason"} entries} (found at the scan, or dropped / replaced when decoded)."""
    entries = [e for k in BAD_KEYS for e in (report or {}).get(k, [])]
    return {"num_skipped": len(entries), "skipped": entries[:MAX_REPORTED]}


class Warner:
    """Warn for the first MAX_WARNINGS bad files, then once more with the count.

    Args:
        what: Names the data in each warning.
        stacklevel: Frames above `__call__` that the warning points at.
    """

    def __init__(self, what: str, stacklevel: int = 2):
        self.what, self.count, self.stacklevel = what, 0, stacklevel + 1

    def __call__(self, path: str, reason: str, action: str) -> None:
        self.count += 1
        if self.count <= MAX_WARNINGS:
            warnings.warn(f"{self.what}: {action} {path}: {reason}", BadImageWarning, stacklevel=self.stacklevel)
        elif self.count == MAX_WARNINGS + 1:
            warnings.warn(f"{self.what}: more bad files; further ones are only counted in the report",
                          BadImageWarning, stacklevel=self.stacklevel)


class BadSamples:
    """Warn about the bad samples that come with each batch and record them in `report[key]`.

    Args:
        what: Names the data in warnings.
        report: The data's report.
        key: The report's list of {"path", "reason"} entries (created if missing).
        action: What was done with each ("replaced", "skipping", "dropped"), for the warning.
        count_key: Also keep the number of entries in `report[count_key]`.
        once: Record each place once (a folder's bad file comes back every epoch).
    """

    def __init__(self, what: str, report: dict[str, Any], key: str, action: str, *, count_key: str | None = None,
                 once: bool = False):
        self.warn = Warner(what, stacklevel=3)  # the warning points at whoever asked for the batch
        self.report, self.key, self.action, self.count_key = report, key, action, count_key
        self.entries: list[dict[str, str]] = report.setdefault(key, [])
        self.seen = {e["path"] for e in self.entries} if once else None

    def __call__(self, notes: list[tuple[str, str]]) -> None:
        for where, reason in notes:
            if self.seen is not None:
                if where in self.seen:
                    continue
                self.seen.add(where)
            self.warn(where, reason, self.action)
            self.entries.append({"path": where, "reason": reason})
        if self.count_key is not None:
            self.report[self.count_key] = len(self.entries)


def shutdown(it: Iterator | None) -> None:
    """Stop a DataLoader iterator's worker processes now rather than whenever it is collected."""
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()


def single_threaded(loader: DataLoader) -> Iterator:
    """Iterate a loader with its batches made on one intra-op thread (see `one_thread`); the caller's code
    between batches keeps its own thread count."""
    it = iter(loader)
    while True:
        with one_thread():
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


class WorkerTrainStream(TrainStream):
    """A TrainStream whose batches come from a DataLoader iterator, started at the stream's position.

    Subclasses give `_loader(position)` and set `bad` (a BadSamples); with `restart_each_epoch`, the loader
    covers one epoch and a new one is started for the next.
    """

    bad: BadSamples
    restart_each_epoch = False
    _it: Iterator | None = None

    def _loader(self, position: Position) -> Iterator:
        raise NotImplementedError

    def _restart(self) -> None:
        shutdown(self._it)  # the next batch starts a new iterator at the (restored) position
        self._it = None

    def close(self) -> None:
        """Stop the worker processes (also done when the stream is collected)."""
        self._restart()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at collection / interpreter exit the workers may already be gone
            self._restart()

    def __next__(self) -> Batch:
        if self._it is None:
            self._it = self._loader(self.position)
        try:
            with one_thread():  # decoding and transforms in this process (num_workers=0) run single-threaded
                x, y, notes = next(self._it)
        except StopIteration:  # cannot happen mid-epoch: the loaders make every step's batch
            raise RuntimeError(f"{self.name} stream ended before the epoch did") from None
        self.bad(notes)
        self.position.advance(self.steps_per_epoch)
        if self.restart_each_epoch and self.position.step == 0:
            self._restart()
        return x, y


class WorkerEvalData(EvalData):
    """EvalData whose batches come from a DataLoader; bad samples are dropped from their batch and recorded.

    Subclasses give `_loader()` and set `bad` (a BadSamples).
    """

    bad: BadSamples

    def _loader(self) -> DataLoader:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        for x, y, notes in single_threaded(self._loader()):
            self.bad(notes)
            if len(y):
                yield x, y
