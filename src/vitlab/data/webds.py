"""WebDataset tar shards (the `webdataset` library) for data too large for one disk or machine.

A sample is the tar members sharing a key: an image (.jpg/.jpeg/.png/.webp/...) and its integer label
(.cls). Training is deterministic per epoch and resumable without decoding anything twice:

- epoch e visits the shards in the permutation drawn from (seed, e); rank r of world_size reads shards
  r, r + world_size, ... of it (WebDataset's usual split by shard, so DDP ranks see disjoint data; unlike the
  other datasets, their batches are not slices of one single-process batch);
- within a rank, logical worker w of num_workers reads every num_workers-th of those shards, in a shuffle
  buffer seeded by (seed, e, r, w), and produces the steps t with t % num_workers == w; a worker whose shards
  run out goes round them again, so every rank has exactly `steps_per_epoch` batches per epoch;
- each sample is augmented under the seed (seed, e, r, t, position), so resuming at (e, t) re-reads the raw
  bytes before t (no decoding) and then produces exactly the batches an uninterrupted run would have.

Bad samples (undecodable image, missing or malformed label) and damaged tar data (a member cut short, a broken
header, a shard without its end-of-archive marker: everything after the damage is lost) are skipped with a
warning naming the shard and member or byte offset, and counted in the report, or raise in strict mode
(`DataError`). Evaluation reports how many samples it expected (data.num_samples, else a count of the shards'
members; unknown when a shard is damaged or not local) next to how many it read.
"""

from __future__ import annotations

import os
import random
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.shardlists import expand_urls

from .batch_augment import derive_seed
from .config import DataConfig
from .errors import DataError
from .images import BadImageError, decode_image, eval_transform, pil_to_tensor, train_transform
from .position import Position, epoch_permutation
from .stream import check_batch_size
from .workers import BadSamples, WorkerEvalData, WorkerTrainStream

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "tif", "tiff", "gif")
LABEL_EXTS = ("cls", "class", "label")


def expand_shards(pattern: str) -> list[str]:
    """"/d/train-{000..009}.tar" (and "a.tar::b.tar") -> the shard list; an empty result is an error."""
    shards = list(expand_urls(pattern))
    if not shards:
        raise ValueError(f"shard pattern {pattern!r} expands to no shards")
    return shards


def _split_name(name: str) -> tuple[str, str]:
    base = os.path.basename(name)
    head, dot, ext = base.partition(".")
    return os.path.join(os.path.dirname(name), head), ext.lower() if dot else ""


TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)  # what a damaged (or damaged gzipped) tar raises
TAIL_CHUNK = 1 << 20


@dataclass
class ShardCount:
    """What a count pass over local shards found.

    Attributes:
        total: Samples with an image member, in the readable part of the shards.
        num_classes: Largest label + 1.
        per_shard: Samples per shard.
        damaged: {"path", "reason"} of each damaged shard (the samples after the damage are not counted).
    """

    total: int
    num_classes: int
    per_shard: list[int]
    damaged: list[dict[str, str]]


def _end_damage(read_rest: Callable[[int], bytes], offset: int, stop_block_read: bool) -> str | None:
    """Why a tar that tarfile says has ended at header `offset` is damaged, or None for a proper end.

    tarfile ends silently at a broken or cut header after the first member; a real end is the end-of-archive
    marker: zero blocks to the end of the file (two at least). `read_rest(n)` reads on from the header at
    `offset` (or from the block after it if `stop_block_read`: tarfile's stream mode has consumed it).
    """
    rest, nonzero = 0, False
    while chunk := read_rest(TAIL_CHUNK):
        rest += len(chunk)
        nonzero = nonzero or chunk.count(0) != len(chunk)
    if nonzero:
        return f"broken tar header at byte {offset}: the bytes after it are unreadable (samples lost)"
    if rest < (1 if stop_block_read else 2) * tarfile.BLOCKSIZE:
        return f"cut short at byte {offset}: no end-of-archive marker (samples after it lost)"
    return None


def count_local_shards(shards: list[str], strict: bool = False) -> ShardCount:
    """Read the tar headers (and the small label members) of local shards.

    A damaged shard (cut short, a broken header) is counted up to the damage and listed in `damaged`; in strict
    mode it raises DataError instead.
    """
    total, max_label, per_shard, damaged = 0, -1, [], []
    for shard in shards:
        if not os.path.isfile(shard):
            raise FileNotFoundError(f"shard {shard!r} does not exist")
        keys_with_image, labels = set(), {}
        where = 0
        try:
            with tarfile.open(shard, "r:*") as tar:
                try:
                    while (m := tar.next()) is not None:
                        where = m.offset_data + m.size
                        if not m.isfile():
                            continue
                        key, ext = _split_name(m.name)
                        if ext in IMAGE_EXTS:
                            keys_with_image.add(key)
                        elif ext in LABEL_EXTS:
                            f = tar.extractfile(m)
                            try:
                                labels[key] = int(f.read(32).decode("ascii").strip()) if f else -1
                            except (ValueError, UnicodeDecodeError):
                                labels[key] = -1
                    assert tar.fileobj is not None
                    tar.fileobj.seek(tar.offset)
                    reason = _end_damage(tar.fileobj.read, tar.offset, False)
                except TAR_ERRORS as e:
                    reason = f"cut short or corrupt after byte {where} ({e}; samples lost)"
        except TAR_ERRORS as e:  # not even the first header reads
            reason = f"not a readable tar file ({e})"
        if reason is not None:
            if strict:
                raise DataError(shard, reason)
            damaged.append({"path": shard, "reason": reason})
        n = len(keys_with_image)
        per_shard.append(n)
        total += n
        good = [labels[k] for k in keys_with_image if labels.get(k, -1) >= 0]
        max_label = max([max_label, *good])
    return ShardCount(total, max_label + 1, per_shard, damaged)


def _is_local(shards: list[str]) -> bool:
    """True for plain file paths (which must then all exist); False for URLs and pipes."""
    if any("://" in s or s.startswith("pipe:") for s in shards):
        return False
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(shards)} shards do not exist, e.g. {missing[0]!r}")
    return True


def _tar_members(shard: str, notes: list[tuple[str, str]]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of the file members of one shard, read in order (tarfile's stream mode: local paths, URLs
    and pipes alike). Damage ends the shard with a note: a member cut short is named, a broken header or a
    missing end-of-archive marker is placed by its byte offset."""
    with wds.gopen(shard) as stream:
        tar: tarfile.TarFile | None = None
        name = None
        try:
            tar = tarfile.open(fileobj=stream, mode="r|*")  # noqa: SIM115 (closed with `stream`; a `with` would hide `tar` from the except)
            while (m := tar.next()) is not None:
                name = m.name
                if not m.isfile():
                    continue
                f = tar.extractfile(m)
                data = f.read() if f else b""
                if len(data) != m.size:
                    notes.append((f"{shard}:{m.name}", f"tar member cut short: {len(data)} of {m.size} bytes"))
                    return
                yield m.name, data
            assert tar.fileobj is not None
            reason = _end_damage(tar.fileobj.read, tar.offset, True)
        except TAR_ERRORS as e:
            at = f"at byte {tar.offset}, after member {name!r}" if tar is not None and name else "at its start"
            reason = f"tar data cut short or corrupt {at} ({e})"
        if reason is not None:
            notes.append((shard, reason))


def _raw_samples(shards: list[str], strict: bool, notes: list) -> Iterator[dict[str, Any]]:
    """Samples (dicts of member bytes, keyed by extension, plus __key__ and __url__) of the shards, in order.

    A sample is the run of consecutive members sharing a key (webdataset's grouping). Damaged tar data is noted
    (see `_tar_members`), or raises DataError in strict mode. Each shard's file is closed by a `with` block, so a
    stream abandoned mid-shard still closes it.
    """
    for shard in shards:
        mine: list[tuple[str, str]] = []
        sample: dict[str, Any] | None = None
        try:
            for name, data in _tar_members(shard, mine):
                key, ext = _split_name(name)
                if sample is None or key != sample["__key__"]:
                    if sample is not None:
                        yield sample
                    sample = {"__key__": key, "__url__": shard}
                if ext in sample:
                    mine.append((f"{shard}:{name}", f"duplicate member {ext!r} for key {key!r}: ignored"))
                    continue
                sample[ext] = data
        except FileNotFoundError:
            raise
        except OSError as e:  # gopen of a URL or pipe
            mine.append((shard, f"cannot be read ({e})"))
        if sample is not None:
            yield sample
        if mine and strict:
            raise DataError(*mine[0])
        notes += mine


def _shuffled(samples: Iterator[dict[str, Any]], bufsize: int, seed: int) -> Iterator[dict[str, Any]]:
    """A deterministic shuffle buffer: fill, then emit a random element and put the next sample in its slot."""
    rng, buf = random.Random(seed), list[dict[str, Any]]()
    for s in samples:
        if len(buf) < bufsize:
            buf.append(s)
            continue
        i = rng.randrange(len(buf))
        buf[i], s = s, buf[i]
        yield s
    rng.shuffle(buf)
    yield from buf


def _decode(sample: dict[str, Any], in_chans: int, max_pixels: int | None) -> tuple[torch.Tensor, int]:
    name = f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}"
    img_key = next((k for k in IMAGE_EXTS if k in sample), None)
    if img_key is None:
        raise BadImageError(f"{name}: no image member ({', '.join(IMAGE_EXTS)})")
    label_key = next((k for k in LABEL_EXTS if k in sample), None)
    if label_key is None:
        raise BadImageError(f"{name}: no label member (.cls)")
    try:
        label = int(bytes(sample[label_key]).decode("ascii").strip())
    except (ValueError, UnicodeDecodeError) as e:
        raise BadImageError(f"{name}: label {bytes(sample[label_key])[:20]!r} is not an integer") from e
    return pil_to_tensor(decode_image(bytes(sample[img_key]), in_chans, max_pixels=max_pixels, name=name)), label


def _decode_or_note(sample: dict[str, Any], in_chans: int, cfg: DataConfig, notes: list[tuple[str, str]]
                    ) -> tuple[torch.Tensor, int] | None:
    """`_decode`, or None with the reason added to `notes` (raised in strict mode)."""
    try:
        return _decode(sample, in_chans, cfg.max_image_pixels)
    except BadImageError as exc:
        if cfg.strict:
            raise
        notes.append((f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}", exc.reason))
        return None


@dataclass
class _Plan:
    """What a worker needs to know about the stream (plain values: no reference back to the stream)."""

    cfg: DataConfig
    shards: list[str]
    seed: int
    rank: int
    world_size: int
    batch_size: int
    steps_per_epoch: int
    logical_workers: int
    num_classes: int
    in_chans: int
    transform: Any


class _EpochShards(IterableDataset):
    """One epoch of one rank: logical worker w yields its steps' batches (see the module docstring)."""

    def __init__(self, plan: _Plan, epoch: int, start_step: int):
        self.s, self.epoch, self.start = plan, epoch, start_step

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, list]]:
        s, e = self.s, self.epoch
        nw = s.logical_workers
        info = get_worker_info()
        # DataLoader worker i plays logical worker (start + i) % nw, so round-robin order is step order
        w = ((info.id if info else 0) + self.start) % nw
        order = epoch_permutation(s.seed, e, len(s.shards)).tolist()
        rank_shards = [s.shards[i] for i in order[s.rank :: s.world_size]]
        mine = rank_shards[w::nw]
        notes: list[tuple[str, str]] = []
        samples = self._endless(mine, e, w, notes)
        done = sum(1 for t in range(self.start) if t % nw == w)  # batches this worker made before `start`
        for _ in range(done * s.batch_size):
            next(samples)  # raw bytes only: nothing decoded
        for t in range(self.start, s.steps_per_epoch):
            if t % nw != w:
                continue
            xs, ys, k = [], [], 0
            while k < s.batch_size:
                sample = next(samples)
                if (decoded := _decode_or_note(sample, s.in_chans, s.cfg, notes)) is None:
                    continue
                img, label = decoded
                if not 0 <= label < s.num_classes:
                    if s.cfg.strict:
                        raise BadImageError(f"{sample.get('__key__')}: label {label} outside [0, {s.num_classes})")
                    notes.append((str(sample.get("__key__")), f"label {label} outside [0, {s.num_classes})"))
                    continue
                with torch.random.fork_rng(devices=[]):
                    torch.default_generator.manual_seed(derive_seed(s.seed, e, s.rank, t, k))
                    xs.append(s.transform(img))
                ys.append(label)
                k += 1
            yield torch.stack(xs), torch.tensor(ys, dtype=torch.long), notes[:]
            notes.clear()

    def _endless(self, shards: list[str], e: int, w: int, notes: list) -> Iterator[dict[str, Any]]:
        s, cycle = self.s, 0
        while True:
            order = shards if cycle == 0 else random.Random(derive_seed(s.seed, e, s.rank, w, cycle)).sample(
                shards, len(shards))
            got = False
            raw = _raw_samples(order, s.cfg.strict, notes)
            for sample in _shuffled(raw, s.cfg.shuffle_buffer, derive_seed(s.seed, e, s.rank, w, cycle, 0x5B)):
                got = True
                yield sample
            if not got:
                raise RuntimeError(f"shards {shards} yielded no samples")
            cycle += 1


class WebDatasetTrainStream(WorkerTrainStream):
    """TrainStream over WebDataset shards (see the module docstring for order and resume)."""

    restart_each_epoch = True  # the next epoch reads a new shard order

    def __init__(self, cfg: DataConfig, *, img_size, in_chans: int, **kw: Any):
        self.cfg, self.in_chans = cfg, in_chans
        self.shards = expand_shards(cfg.root or "")  # DataConfig requires a root for webdataset
        damaged: list[dict[str, str]] = []
        if _is_local(self.shards):
            count = count_local_shards(self.shards, strict=cfg.strict)  # the reads note the damage, once
            total, num_classes, per_shard, damaged = count.total, count.num_classes, count.per_shard, count.damaged
        elif cfg.num_samples is None or cfg.num_classes is None:
            raise ValueError("webdataset shards that are not local files need data.num_samples and data.num_classes")
        else:
            total, num_classes, per_shard = cfg.num_samples, cfg.num_classes, []
        if cfg.val_fraction > 0:
            raise ValueError("data.val_fraction is not supported for webdataset: hold out shards as data.test_root")
        num_classes = cfg.num_classes or num_classes
        if num_classes <= 0:
            raise ValueError(f"no labelled samples (.cls) found in {cfg.root!r}")
        classes = list(cfg.class_names) if cfg.class_names else [str(i) for i in range(num_classes)]
        if len(classes) != num_classes:
            raise ValueError(f"data.class_names has {len(classes)} names for {num_classes} classes")
        super().__init__(name="webdataset", classes=classes, epoch_size=cfg.num_samples or total,
                         report={"dataset": "webdataset", "shards": len(self.shards), "samples": total,
                                 "samples_per_shard": per_shard, "damaged_shards": damaged, "skipped": [],
                                 "num_skipped": 0}, **kw)
        self.logical_workers = max(1, cfg.num_workers)
        if len(self.shards) < self.world_size * self.logical_workers:
            raise ValueError(
                f"{len(self.shards)} shards cannot feed world_size {self.world_size} x {self.logical_workers} "
                "workers; write more shards or use fewer workers"
            )
        self.transform = train_transform(cfg, img_size, in_chans)
        # once: a bad sample or damaged shard met again in a later epoch is not reported (or counted) again
        self.bad = BadSamples("webdataset stream", self.report, "skipped", "skipping", count_key="num_skipped",
                              once=True)

    def _loader(self, pos: Position) -> Iterator:
        plan = _Plan(self.cfg, self.shards, self.seed, self.rank, self.world_size, self.batch_size,
                     self.steps_per_epoch, self.logical_workers, self.num_classes, self.in_chans, self.transform)
        ds = _EpochShards(plan, pos.epoch, pos.step)
        return iter(DataLoader(ds, batch_size=None, num_workers=self.cfg.num_workers,
                               generator=torch.Generator().manual_seed(self.seed)))


class _EvalShards(IterableDataset):
    def __init__(self, data: WebDatasetEvalData):
        self.d = data

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, list]]:
        d = self.d
        info = get_worker_info()
        shards = d.shards[info.id :: info.num_workers] if info else d.shards
        notes: list[tuple[str, str]] = []
        xs, ys = [], []
        for sample in _raw_samples(shards, d.cfg.strict, notes):
            if (decoded := _decode_or_note(sample, d.in_chans, d.cfg, notes)) is None:
                continue
            img, label = decoded
            xs.append(d.transform(img))
            ys.append(label)
            if len(xs) == d.batch_size:
                yield torch.stack(xs), torch.tensor(ys, dtype=torch.long), notes[:]
                xs, ys = [], []
                notes.clear()
        if xs or notes:
            yield (torch.stack(xs) if xs else torch.empty(0)), torch.tensor(ys, dtype=torch.long), notes[:]


class WebDatasetEvalData(WorkerEvalData):
    """The "test" shards (data.test_root), read in order with a deterministic resize."""

    def __init__(self, cfg: DataConfig, split: str, *, img_size, in_chans: int, batch_size: int):
        if split != "test":
            raise ValueError(f"webdataset evaluation reads the 'test' split from data.test_root, not {split!r}")
        if not cfg.test_root:
            raise ValueError("webdataset evaluation needs data.test_root (a shard pattern)")
        check_batch_size(batch_size)
        self.cfg, self.in_chans, self.batch_size = cfg, in_chans, batch_size
        self.shards = expand_shards(cfg.test_root)
        if _is_local(self.shards):
            count = count_local_shards(self.shards, strict=cfg.strict)
            total, num_classes = count.total, count.num_classes
            if cfg.num_samples is not None:
                expected, source = cfg.num_samples, "data.num_samples"
            elif count.damaged:
                expected, source = None, (f"unknown: {len(count.damaged)} damaged shard(s) hide how many samples "
                                          f"they held (the readable parts hold {total}); set data.num_samples")
            else:
                expected, source = total, "a count of the shards' tar members"
        else:
            total, num_classes = cfg.num_samples or 0, cfg.num_classes or 0
            expected, source = cfg.num_samples, ("data.num_samples" if cfg.num_samples else
                                                 "unknown: the shards are not local files; set data.num_samples")
        num_classes = cfg.num_classes or num_classes
        self.classes = list(cfg.class_names) if cfg.class_names else [str(i) for i in range(num_classes)]
        self.num_samples = total
        self.transform = eval_transform(img_size, in_chans, normalize=cfg.normalize, resize=cfg.eval_resize,
                                        crop_fraction=cfg.eval_crop_fraction)
        self.report = {"dataset": "webdataset", "split": "test", "shards": len(self.shards), "samples": total,
                       "expected_samples": expected, "expected_from": source, "skipped": [], "num_skipped": 0}
        self.bad = BadSamples("webdataset evaluation", self.report, "skipped", "dropped", count_key="num_skipped")

    def _loader(self) -> DataLoader:
        nw = min(self.cfg.num_workers, len(self.shards))
        return DataLoader(_EvalShards(self), batch_size=None, num_workers=nw,
                          generator=torch.Generator().manual_seed(0))
