"""ImageFolder trees (root/<class>/<image>): an up-front scan, bad-file handling, and file-based streams.

Bad data never stops a run. The scan (PIL verify: header and, for PNG, checksums; no full decode) drops
non-image, corrupt and oversized files, warns naming each, and counts them in the report; what the scan
cannot see (a truncated JPEG body) fails at decode time, where a training sample is replaced by the next
good file of the dataset (deterministically) and an evaluation sample is dropped, again warned and counted.
In strict mode every bad file is an error. A missing root, a tree without class folders, or a class folder
without a single good image is an error before training starts.

Symbolic links are followed, but no folder or file is read twice (they are known by device and inode): a link
cycle or a link to images already in the tree is reported and not followed, so it cannot relabel them. Only
regular files are ever opened (a FIFO would block the scan forever); anything else is skipped and reported.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .arrays import stratified_holdout
from .batch_augment import derive_seed
from .config import DataConfig
from .errors import DataError
from .images import (
    BadImageError,
    decode_image,
    eval_transform,
    pil_to_tensor,
    train_transform,
    verify_image,
)
from .position import Position, epoch_permutation
from .stream import check_batch_size
from .workers import BadSamples, Warner, WorkerEvalData, WorkerTrainStream

MAX_REPLACEMENT_TRIES = 16


@dataclass
class FileIndex:
    """The good files of a tree: paths, int64 labels, class names, and what was skipped."""

    paths: list[str]
    labels: np.ndarray
    classes: list[str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    hidden: int = 0

    def subset(self, idx: np.ndarray) -> FileIndex:
        return FileIndex([self.paths[i] for i in idx], self.labels[idx], self.classes, self.skipped, self.hidden)


def scan_tree(
    root: str,
    *,
    classes: list[str] | None = None,
    verify: bool = True,
    strict: bool = False,
    max_pixels: int | None = None,
) -> FileIndex:
    """List a class tree's images, dropping bad files (or raising in strict mode).

    Symbolic links are followed, safely (see `_TreeWalk`): every folder and every file is read once, whatever
    the paths that lead to it, so a link cycle (`cat/up -> ..`) or a second path to the same images (`cat/x ->
    ../dog`) cannot relabel anything; each such link is reported, not followed. Only regular files are opened:
    FIFOs, sockets and devices are skipped with a warning (opening a FIFO would wait forever).

    Args:
        root: The folder whose sub-folders are the classes (sorted by name; hidden ones ignored).
        classes: The label space to use (a test tree's folders must be among the training tree's classes).
        verify: Check every file with PIL's verify (cheap) instead of trusting it until it is decoded.
        strict: Raise on the first file the scan would skip (BadImageError for a bad image, DataError for
            anything else) instead of skipping it.
        max_pixels: Decompression-bomb limit (None: PIL's).

    Raises:
        FileNotFoundError: root does not exist.
        DataError: No class folders, an empty class folder, two class folders that are the same folder, or a
            class unknown to `classes`.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder root {root!r} does not exist or is not a directory")
    dirs = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not dirs:
        raise DataError(root, "image folder has no class sub-folders (expected root/<class>/<image files>)")
    if classes is None:
        classes = dirs
    else:
        unknown = sorted(set(dirs) - set(classes))
        if unknown:
            raise DataError(root, f"image folder has classes {unknown} that the training set does not have")
    label_of = {c: i for i, c in enumerate(classes)}
    walk = _TreeWalk(root, dirs, strict, Warner(f"image folder {root}"))
    paths, labels = [], []
    for name, files in walk.files().items():
        good = 0
        for path in files:
            reason = verify_image(path, max_pixels=max_pixels) if verify else None
            if reason is not None:
                if strict:
                    raise BadImageError(f"{path}: {reason}")
                walk.skip(path, reason)
                continue
            paths.append(path)
            labels.append(label_of[name])
            good += 1
        if good == 0:
            top = os.path.join(root, name)
            bad = sum(1 for s in walk.skipped if s["path"].startswith(top + os.sep))
            raise DataError(top, "class folder has no usable images"
                            + (f" ({bad} bad files skipped)" if bad else " (it is empty)"))
    return FileIndex(paths, np.asarray(labels, dtype=np.int64), list(classes), walk.skipped, walk.hidden)


class _TreeWalk:
    """The files of each class folder, symbolic links followed without reading anything twice.

    Folders and files are known by their (st_dev, st_ino). First every class folder's real (not linked) content
    is listed, registering each folder and file; then the symbolic links met on the way are resolved, class by
    class in name order: a link to a folder or file already registered (the tree root, a class folder, anything
    inside one: a cycle, or a second path to the same images) is reported and not followed, so a file belongs
    to the class it really sits in; a link to new content is followed (links found there join the queue). A
    broken link, an unreadable folder and anything that is not a regular file or a folder (FIFO, socket,
    device) is reported and skipped: such a file is never opened.
    """

    def __init__(self, root: str, classes: list[str], strict: bool, warn: Warner):
        self.root, self.classes, self.strict, self.warn = root, classes, strict, warn
        self.skipped: list[dict[str, str]] = []
        self.hidden = 0
        self.dirs: dict[tuple[int, int], str] = {_ident(os.stat(root)): root}
        self.seen_files: dict[tuple[int, int], str] = {}

    def skip(self, path: str, reason: str) -> None:
        self.warn(path, reason, "skipping")
        self.skipped.append({"path": path, "reason": reason})

    def _note(self, path: str, reason: str) -> None:
        if self.strict:
            raise DataError(path, reason)
        self.skip(path, reason)

    def files(self) -> dict[str, list[str]]:
        """{class: [file paths]} in a deterministic order (real content first, then what links lead to)."""
        out: dict[str, list[str]] = {c: [] for c in self.classes}
        links: dict[str, list[str]] = {c: [] for c in self.classes}
        for c in self.classes:
            top = os.path.join(self.root, c)
            key = _ident(os.stat(top))
            if key in self.dirs:
                raise DataError(top, f"class folder is the same folder as {self.dirs[key]!r} (a symbolic link?)")
            self.dirs[key] = top
        for c in self.classes:
            self._list(os.path.join(self.root, c), out[c], links[c])
        for c in self.classes:
            queue = links[c]
            while queue:
                self._follow(queue.pop(0), out[c], queue)
        return out

    def _follow(self, link: str, files: list[str], links: list[str]) -> None:
        try:
            st = os.stat(link)
        except OSError as e:
            return self._note(link, f"broken symbolic link ({e.strerror})")
        key = _ident(st)
        if stat.S_ISDIR(st.st_mode):
            if key in self.dirs:
                return self._note(link, f"symbolic link to {self.dirs[key]!r}, a folder already read: not followed "
                                        "(a cycle, or a second path to the same images)")
            self.dirs[key] = link
            self._list(link, files, links)
        else:
            self._file(link, st, files)

    def _file(self, path: str, st: os.stat_result, files: list[str]) -> None:
        if not stat.S_ISREG(st.st_mode):
            return self._note(path, f"not a regular file ({_kind(st.st_mode)}): never opened")
        key = _ident(st)
        if key in self.seen_files:
            return self._note(path, f"the same file as {self.seen_files[key]!r}: counted once")
        self.seen_files[key] = path
        files.append(path)

    def _list(self, top: str, files: list[str], links: list[str]) -> None:
        """Walk the real folders under `top` (files before sub-folders, names sorted); defer symbolic links."""
        stack = [top]
        while stack:
            folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
            except OSError as err:
                self._note(folder, f"unreadable folder ({err.strerror})")
                continue
            subdirs = []
            for entry in entries:
                if entry.name.startswith("."):
                    self.hidden += 0 if entry.is_dir() else 1
                    continue
                if entry.is_symlink():
                    links.append(entry.path)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError as err:
                    self._note(entry.path, f"cannot be read ({err.strerror})")
                    continue
                if stat.S_ISDIR(st.st_mode):
                    key = _ident(st)
                    if key in self.dirs:  # a bind mount back into the tree
                        self._note(entry.path, f"the same folder as {self.dirs[key]!r}: not read twice")
                        continue
                    self.dirs[key] = entry.path
                    subdirs.append(entry.path)
                else:
                    self._file(entry.path, st, files)
            stack.extend(reversed(subdirs))


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


@functools.lru_cache(maxsize=8)
def _scan_cached(root: str, classes: tuple[str, ...] | None, verify: bool, strict: bool, max_pixels: int | None,
                 stamp: tuple) -> FileIndex:
    del stamp  # cache key only
    return scan_tree(root, classes=list(classes) if classes else None, verify=verify, strict=strict,
                     max_pixels=max_pixels)


def _scan(root: str, cfg: DataConfig, classes: list[str] | None = None) -> FileIndex:
    """scan_tree, once per process for an unchanged tree (train stream and val/test data share it)."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder root {root!r} does not exist or is not a directory")
    stamp = tuple(sorted((e.name, e.stat().st_mtime_ns) for e in os.scandir(root) if e.is_dir()))
    return _scan_cached(os.path.abspath(root), tuple(classes) if classes else None, cfg.verify_files, cfg.strict,
                        cfg.max_image_pixels, stamp)


def folder_roots(cfg: DataConfig) -> tuple[str, str | None]:
    """(training tree, test tree or None) of an imagefolder config."""
    root = cfg.root
    if not root or not os.path.isdir(root):
        raise FileNotFoundError(f"data.root {root!r} does not exist or is not a directory")
    train = os.path.join(root, cfg.train_subdir)
    has_split = os.path.isdir(train)
    train = train if has_split else root
    test: str | None
    if cfg.test_root:
        test = cfg.test_root
    elif os.path.isdir(os.path.join(root, cfg.test_subdir)):
        test = os.path.join(root, cfg.test_subdir)
    else:
        test = None if has_split else root  # a single class tree: evaluating "test" reads that tree
    return train, test


def folder_split(cfg: DataConfig, split: str) -> tuple[FileIndex, dict[str, Any]]:
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be one of ('train', 'val', 'test'), got {split!r}")
    if split == "val" and cfg.val_fraction <= 0:
        raise ValueError("split 'val' is the hold-out part of train; set data.val_fraction > 0 (e.g. 0.02)")
    train_root, test_root = folder_roots(cfg)
    train = _scan(train_root, cfg)
    if split == "test":
        if test_root is None:
            raise FileNotFoundError(
                f"no test tree: {os.path.join(str(cfg.root), cfg.test_subdir)!r} does not exist; set data.test_root"
            )
        index = train if os.path.abspath(test_root) == os.path.abspath(train_root) else _scan(
            test_root, cfg, train.classes)
        root = test_root
    else:
        tr, va = stratified_holdout(train.labels, cfg.val_fraction, cfg.val_seed)
        index, root = train.subset(tr if split == "train" else va), train_root
    if cfg.class_names is not None:
        if len(cfg.class_names) != len(index.classes):
            raise ValueError(f"data.class_names has {len(cfg.class_names)} names; the tree has "
                             f"{len(index.classes)} classes")
        index = FileIndex(index.paths, index.labels, list(cfg.class_names), index.skipped, index.hidden)
    report = {
        "dataset": "imagefolder",
        "root": root,
        "split": split,
        "samples": len(index.paths),
        "num_skipped": len(index.skipped),
        "skipped": list(index.skipped),
        "hidden_files_ignored": index.hidden,
    }
    return index, report


class FolderDataset(Dataset):
    """Map-style dataset whose keys are (index, augmentation key or None).

    Returns (image float32 (C, H, W) or None, label, [(path, reason), ...] of files that failed to decode).
    With `replace`, a file that fails is replaced by the next good one in the index.
    """

    def __init__(self, index: FileIndex, transform, in_chans: int, *, replace: bool, strict: bool,
                 max_pixels: int | None):
        self.index, self.transform, self.in_chans = index, transform, in_chans
        self.replace, self.strict, self.max_pixels = replace, strict, max_pixels

    def __len__(self) -> int:
        return len(self.index.paths)

    def __getitem__(self, key: tuple[int, tuple[int, ...] | None]):
        i, aug_key = key
        n, bad = len(self.index.paths), []
        for attempt in range(MAX_REPLACEMENT_TRIES if self.replace else 1):
            j = (i + attempt) % n
            path = self.index.paths[j]
            try:
                img = pil_to_tensor(decode_image(path, self.in_chans, max_pixels=self.max_pixels))
            except BadImageError as e:
                if self.strict:
                    raise
                bad.append((path, e.reason))
                continue
            if aug_key is None:
                return self.transform(img), int(self.index.labels[j]), bad
            # per-sample randomness from its key, not from history; CPU generator only (torch.manual_seed would
            # also queue seeds for every accelerator backend, recording a stack trace each time)
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(derive_seed(*aug_key))
                return self.transform(img), int(self.index.labels[j]), bad
        if self.replace:
            raise RuntimeError(f"{MAX_REPLACEMENT_TRIES} consecutive files from {self.index.paths[i]} failed to "
                               "decode; the data set looks broken (see the warnings)")
        return None, int(self.index.labels[i]), bad


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]]]:
    """Stack the good samples; pass the bad-file notes through."""
    bad = [b for _, _, bs in items for b in bs]
    good = [(x, y) for x, y, _ in items if x is not None]
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), bad
    return torch.stack([x for x, _ in good]), torch.tensor([y for _, y in good], dtype=torch.long), bad


class _GlobalOrder:
    """Batch sampler: this rank's keys for every step from a starting position on, endlessly.

    Holds plain numbers, not the stream, so the stream -> loader -> sampler chain has no reference cycle
    (a cycle would leave worker shutdown to the garbage collector).
    """

    def __init__(self, n: int, start: Position, *, seed: int, steps_per_epoch: int, batch_size: int, rank: int,
                 world_size: int):
        self.n, self.epoch, self.step = n, start.epoch, start.step
        self.seed, self.steps, self.B, self.r, self.G = seed, steps_per_epoch, batch_size, rank, batch_size * world_size

    def __iter__(self) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
        epoch, step, G, B, r = self.epoch, self.step, self.G, self.B, self.r
        while True:
            perm = epoch_permutation(self.seed, epoch, self.n)
            for t in range(step, self.steps):
                mine = perm[t * G : (t + 1) * G][r * B : (r + 1) * B].tolist()
                yield [(i, (self.seed, epoch, t, r * B + k)) for k, i in enumerate(mine)]
            epoch, step = epoch + 1, 0


class FileTrainStream(WorkerTrainStream):
    """TrainStream over a FileIndex, decoded and augmented image by image (torchvision.transforms.v2) in
    DataLoader workers, each sample under the seed of its (epoch, step, position in the global batch)."""

    def __init__(self, index: FileIndex, cfg: DataConfig, *, img_size, in_chans: int, report: dict[str, Any],
                 **kw: Any):
        super().__init__(name="imagefolder", classes=index.classes, epoch_size=len(index.paths), report=report, **kw)
        self.cfg = cfg
        self.dataset = FolderDataset(index, train_transform(cfg, img_size, in_chans), in_chans, replace=True,
                                     strict=cfg.strict, max_pixels=cfg.max_image_pixels)
        self.bad = BadSamples("training stream", self.report, "replaced_at_load", "replaced",
                              count_key="num_replaced", once=True)

    def _loader(self, position: Position) -> Iterator:
        return iter(DataLoader(
            self.dataset,
            batch_sampler=_GlobalOrder(len(self.dataset), position, seed=self.seed,
                                       steps_per_epoch=self.steps_per_epoch, batch_size=self.batch_size,
                                       rank=self.rank, world_size=self.world_size),
            num_workers=self.cfg.num_workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(self.seed),  # never draw from the global RNG
        ))


class FileEvalData(WorkerEvalData):
    """EvalData over a FileIndex: deterministic resize, bad files dropped from their batch and reported."""

    def __init__(self, index: FileIndex, cfg: DataConfig, *, img_size, in_chans: int, batch_size: int,
                 report: dict[str, Any]):
        check_batch_size(batch_size)
        tf = eval_transform(img_size, in_chans, normalize=cfg.normalize, resize=cfg.eval_resize,
                            crop_fraction=cfg.eval_crop_fraction)
        self.dataset = FolderDataset(index, tf, in_chans, replace=False, strict=cfg.strict,
                                     max_pixels=cfg.max_image_pixels)
        self.cfg, self.classes, self.batch_size, self.report = cfg, index.classes, batch_size, report
        self.num_samples = len(index.paths)
        self.bad = BadSamples("evaluation data", self.report, "dropped_at_load", "dropped", once=True)

    def _loader(self) -> DataLoader:
        n = len(self.dataset)
        batches = [[(i, None) for i in range(s, min(s + self.batch_size, n))] for s in range(0, n, self.batch_size)]
        return DataLoader(self.dataset, batch_sampler=batches, num_workers=self.cfg.num_workers,
                          collate_fn=collate, generator=torch.Generator().manual_seed(0))


def build_folder_train_stream(cfg: DataConfig, *, img_size, in_chans: int, **kw: Any) -> FileTrainStream:
    index, report = folder_split(cfg, "train")
    return FileTrainStream(index, cfg, img_size=img_size, in_chans=in_chans, report=report, **kw)


def build_folder_eval_data(cfg: DataConfig, split: str, *, img_size, in_chans: int, batch_size: int) -> FileEvalData:
    index, report = folder_split(cfg, split)
    return FileEvalData(index, cfg, img_size=img_size, in_chans=in_chans, batch_size=batch_size, report=report)
