"""`DataConfig`: the `data:` section of a recipe, and the CLI shorthand `parse_data_spec`."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..models.config import check_bool, check_keys, check_number

DATASETS = ("fashion_mnist", "mnist", "cifar10", "cifar100", "imagefolder", "webdataset", "synthetic", "digits")
BUILTIN = ("fashion_mnist", "synthetic", "digits")  # need no data.root
NORMALIZE = ("inception", "imagenet")
EVAL_RESIZE = ("resize", "center_crop")
ERASING_VALUES = ("random", "zero")
PAIRS = ("crop_scale", "crop_ratio", "erasing_scale", "erasing_ratio")  # (min, max) fields, lists in YAML

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


@dataclass
class DataConfig:
    """Where the images come from and how they are augmented.

    Attributes:
        dataset: One of `DATASETS`. "synthetic" is generated in memory, shaped like Fashion-MNIST (no root;
            see `vitlab.data.synthetic`), for tests and smoke runs. "digits" is scikit-learn's 1,797 real 8x8
            handwritten digits with a fixed 1,297 / 500 train / test split (no root; `vitlab.data.digits`).
        root: Dataset location. fashion_mnist defaults to Debian's /usr/share/datasets/fashion-mnist;
            imagefolder: a class tree, or a folder with `train_subdir` / `test_subdir` class trees;
            cifar10/100: the folder holding (or being) cifar-10-batches-bin / cifar-100-binary;
            webdataset: a shard pattern such as /data/train-{000000..000127}.tar.
        test_root: Where the "test" split is, when not derivable from `root` (imagefolder: a class tree;
            webdataset: a shard pattern).
        train_subdir: imagefolder: sub-folder of `root` holding the training tree, if present.
        test_subdir: imagefolder: sub-folder of `root` holding the test tree ("val" for ImageNet).
        val_fraction: Fraction of train held out as the "val" split, stratified by class and fixed by
            `val_seed` (the paper holds out 1-2%). 0 disables the split.
        val_seed: Seed of the hold-out split; independent of the training seed so every run sees the same one.
        normalize: "inception" maps pixels to [-1, 1] (what Google's checkpoints expect); "imagenet" uses
            the ImageNet mean/std.
        expand_channels: Repeat greyscale data (Fashion-MNIST, MNIST, synthetic) to 3 channels for in_chans=3
            models.
        inception_crop: Random resized crop ("inception crop") for training; off: plain resize.
        crop_scale: Area fraction range of the inception crop.
        crop_ratio: Aspect-ratio range of the inception crop.
        hflip: Random horizontal flips for training.
        randaugment: "N-M" (number of ops - magnitude on big_vision's 0-10 scale), e.g. "2-10"; None = off.
        random_erasing: Probability of random erasing (Zhong et al.) per training image, after normalisation;
            0 = off. One rectangle of area fraction in `erasing_scale` and aspect ratio in `erasing_ratio`.
        erasing_scale: Area fraction range of the erased rectangle.
        erasing_ratio: Aspect-ratio range of the erased rectangle.
        erasing_value: "random" (per-pixel standard normal noise) or "zero" (the normalisation's mean).
        eval_resize: "resize" squashes the whole image to img_size (the paper's fine-tuning eval);
            "center_crop" resizes the shorter side to img_size / eval_crop_fraction and crops the centre.
        eval_crop_fraction: Crop fraction for eval_resize="center_crop" (0.875 is the ImageNet habit).
        strict: Raise on a corrupt, truncated or non-image file instead of skipping it with a warning.
        verify_files: imagefolder: check every file up front with PIL's verify (header, PNG checksums; no
            decode). Off for huge trees: bad files are then only found, and handled, when decoded.
        max_image_pixels: Refuse images with more pixels than this (decompression bombs); None keeps
            PIL's default (about 89 M pixels).
        num_workers: DataLoader worker processes for file datasets (imagefolder, webdataset).
        shuffle_buffer: webdataset: samples shuffled together (within a group of consecutive shards).
        num_samples: webdataset: samples in the training shards, needed when shards are not local files;
            synthetic: training samples (default 60,000; the test split gets a sixth as many).
        num_classes: webdataset: classes, needed when shards are not local files.
        class_names: Optional names of the classes (webdataset, or to rename any dataset's classes; after
            `classes`).
        classes: Keep only these class indices, relabelled 0..k-1 in the order given (every split; in-memory
            datasets).
        train_subset: Train on a random N-image subset of the training split (after `classes` and the val
            hold-out), stratified and nested: for one `subset_seed` the smaller subsets are prefixes of the bigger.
        labels_per_class: Train on K images per class (nested for growing K); excludes `train_subset`.
        subset_seed: Seed of `train_subset` / `labels_per_class`.
    """

    dataset: str = "fashion_mnist"
    root: str | None = None
    test_root: str | None = None
    train_subdir: str = "train"
    test_subdir: str = "test"
    val_fraction: float = 0.0
    val_seed: int = 0
    normalize: str = "inception"
    expand_channels: bool = False
    inception_crop: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: bool = True
    randaugment: str | None = None
    random_erasing: float = 0.0
    erasing_scale: tuple[float, float] = (0.02, 0.33)
    erasing_ratio: tuple[float, float] = (0.3, 3.3)
    erasing_value: str = "random"
    eval_resize: str = "resize"
    eval_crop_fraction: float = 0.875
    strict: bool = False
    verify_files: bool = True
    max_image_pixels: int | None = None
    num_workers: int = 0
    shuffle_buffer: int = 10_000
    num_samples: int | None = None
    num_classes: int | None = None
    class_names: list[str] | None = None
    classes: list[int] | None = None
    train_subset: int | None = None
    labels_per_class: int | None = None
    subset_seed: int = 0

    def __post_init__(self) -> None:
        for name in PAIRS:
            value = getattr(self, name)
            if isinstance(value, list):
                setattr(self, name, tuple(value))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.dataset not in DATASETS:
            raise ValueError(f"data.dataset must be one of {DATASETS}, got {self.dataset!r}")
        if self.dataset not in BUILTIN and not self.root:
            raise ValueError(f"data.root is required for dataset {self.dataset!r}")
        check_number("data.val_fraction", self.val_fraction, lo=0.0, hi=1.0, hi_open=True, what="in [0, 1)")
        check_number("data.val_seed", self.val_seed, integer=True, lo=0, what="an int >= 0")
        if self.normalize not in NORMALIZE:
            raise ValueError(f"data.normalize must be one of {NORMALIZE}, got {self.normalize!r}")
        if self.eval_resize not in EVAL_RESIZE:
            raise ValueError(f"data.eval_resize must be one of {EVAL_RESIZE}, got {self.eval_resize!r}")
        check_number("data.eval_crop_fraction", self.eval_crop_fraction, lo=0.0, hi=1.0, lo_open=True,
                     what="in (0, 1]")
        lo, hi = _pair("crop_scale", self.crop_scale)
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"data.crop_scale must satisfy 0 < min <= max <= 1, got {self.crop_scale!r}")
        lo, hi = _pair("crop_ratio", self.crop_ratio)
        if not 0.0 < lo <= hi:
            raise ValueError(f"data.crop_ratio must satisfy 0 < min <= max, got {self.crop_ratio!r}")
        if self.randaugment is not None:
            parse_randaugment(self.randaugment)
        check_number("data.random_erasing", self.random_erasing, lo=0.0, hi=1.0, what="a probability in [0, 1]")
        lo, hi = _pair("erasing_scale", self.erasing_scale)
        if not 0.0 < lo <= hi < 1.0:
            raise ValueError(f"data.erasing_scale must satisfy 0 < min <= max < 1, got {self.erasing_scale!r}")
        lo, hi = _pair("erasing_ratio", self.erasing_ratio)
        if not 0.0 < lo <= hi:
            raise ValueError(f"data.erasing_ratio must satisfy 0 < min <= max, got {self.erasing_ratio!r}")
        if self.erasing_value not in ERASING_VALUES:
            raise ValueError(f"data.erasing_value must be one of {ERASING_VALUES}, got {self.erasing_value!r}")
        for name in ("expand_channels", "inception_crop", "hflip", "strict", "verify_files"):
            check_bool(f"data.{name}", getattr(self, name))
        check_number("data.num_workers", self.num_workers, integer=True, lo=0, what="an int >= 0")
        check_number("data.shuffle_buffer", self.shuffle_buffer, integer=True, lo=1, what="a positive int")
        self._validate_subsets()
        for name in ("num_samples", "num_classes", "max_image_pixels"):
            check_number(f"data.{name}", getattr(self, name), integer=True, lo=1, allow_none=True,
                         what="None or a positive int")

    def _validate_subsets(self) -> None:
        if self.classes is not None:
            if isinstance(self.classes, tuple):
                self.classes = list(self.classes)
            if not isinstance(self.classes, list) or len(self.classes) < 2:
                raise ValueError(f"data.classes must be a list of at least two class indices, got {self.classes!r}")
            for i, c in enumerate(self.classes):
                check_number(f"data.classes[{i}]", c, integer=True, lo=0, what="a class index (an int >= 0)")
            if len(set(self.classes)) != len(self.classes):
                raise ValueError(f"data.classes lists a class twice: {self.classes!r}")
        for name in ("train_subset", "labels_per_class"):
            check_number(f"data.{name}", getattr(self, name), integer=True, lo=1, allow_none=True,
                         what="None or a positive int")
        if self.train_subset is not None and self.labels_per_class is not None:
            raise ValueError("data.train_subset and data.labels_per_class both set; choose one")
        check_number("data.subset_seed", self.subset_seed, integer=True, lo=0, what="an int >= 0")
        if (self.classes is not None or self.train_subset is not None or self.labels_per_class is not None) and \
                self.dataset in ("imagefolder", "webdataset"):
            raise ValueError(f"data.classes, data.train_subset and data.labels_per_class work on in-memory datasets "
                             f"(fashion_mnist, mnist, cifar10, cifar100, synthetic, digits), not {self.dataset!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in PAIRS:
            d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataConfig:
        return cls(**check_keys(d, cls, "data"))

    def replace(self, **overrides: Any) -> DataConfig:
        return DataConfig.from_dict({**self.to_dict(), **overrides})


def _pair(name: str, value: Any) -> tuple[float, float]:
    """A (min, max) field as two finite floats (an inf aspect ratio or scale would reach log() and the crop)."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"data.{name} must be a pair of numbers, got {value!r}")
    for i, v in enumerate(value):
        check_number(f"data.{name}[{i}]", v)
    return float(value[0]), float(value[1])


def parse_randaugment(spec: str) -> tuple[int, int]:
    """"N-M" -> (num_ops, magnitude); the magnitude is on the 0-10 scale of big_vision / the RandAugment paper."""
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(spec))
    if not m:
        raise ValueError(f"data.randaugment must look like 'N-M' (e.g. '2-10'), got {spec!r}")
    n, mag = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ValueError(f"data.randaugment needs at least one op, got {spec!r}")
    if mag > 10:
        raise ValueError(
            f"data.randaugment magnitude {mag} is above 10, the strongest torchvision's RandAugment can apply"
        )
    return n, mag


def parse_data_spec(spec: str) -> DataConfig:
    """CLI shorthand -> DataConfig.

    "fashion_mnist", "fashion_mnist:/path", "imagefolder:/path", "cifar10:/path", "cifar100:/path",
    "webdataset:/path/shard-{000..009}.tar" (those shards are the data of whichever split is asked for). A bare
    existing path is not guessed: name the dataset.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty data spec; expected e.g. 'fashion_mnist' or 'imagefolder:/path/to/tree'")
    name, sep, root = spec.strip().partition(":")
    name = name.strip().lower().replace("-", "_")
    aliases = {"fmnist": "fashion_mnist", "cifar_10": "cifar10", "cifar_100": "cifar100", "wds": "webdataset"}
    name = aliases.get(name, name)
    if name not in DATASETS:
        raise ValueError(
            f"unknown dataset {name!r} in data spec {spec!r}; expected '<dataset>[:<root>]' with dataset one of "
            f"{DATASETS}"
        )
    if sep and not root:
        raise ValueError(f"data spec {spec!r} has an empty root after ':'")
    if name == "webdataset":
        if not root:
            raise ValueError(f"data spec {spec!r} needs the shard pattern: 'webdataset:/path/shard-{{000..009}}.tar'")
        # one set of shards, read for whichever split is asked for (evaluation reads "test" from test_root)
        return DataConfig(dataset=name, root=root, test_root=root)
    return DataConfig(dataset=name, root=root or None)
