"""Decoding image files safely, and the per-image torchvision.transforms.v2 pipelines of file datasets.

Every file goes through `decode_image`: decompression bombs are refused before any pixel is decoded (PIL's
DecompressionBombWarning and DecompressionBombError, or our own `max_pixels`), the whole image is decoded
(so a truncated file fails here, not later), EXIF orientation is applied, and greyscale, palette, RGBA,
CMYK and 16-bit images are converted to "L" (in_chans=1) or "RGB" (in_chans=3).
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2 as T
from PIL import Image, ImageOps, UnidentifiedImageError

from ..models.config import to_hw
from ..models.preprocess import Preprocess, from_stats, resolve
from ..weights.checkpoint import resolved_preprocess
from .batch_augment import norm_stats
from .config import DataConfig
from .errors import DataError
from .stream import randaugment_op


class BadImageError(DataError):
    """A file (or tar member) that is not a decodable, acceptable image; the message names it and says why."""


class BadImageWarning(UserWarning):
    """A bad file was skipped (or replaced) and counted in the report."""


def decode_image(src: str | bytes, in_chans: int, *, max_pixels: int | None = None, name: str | None = None):
    """Open, check and fully decode one image into mode "L" or "RGB".

    Args:
        src: A path or the encoded bytes.
        in_chans: 1 or 3.
        max_pixels: Refuse images with more pixels (None: PIL's MAX_IMAGE_PIXELS).
        name: What to call the image in errors (defaults to the path).

    Returns:
        A loaded PIL image.

    Raises:
        BadImageError: Not an image, truncated or corrupt, or too large (a decompression bomb).
    """
    label = name or (src if isinstance(src, str) else "<bytes>")
    if in_chans not in (1, 3):
        raise ValueError(f"image files decode to 1 or 3 channels, got in_chans={in_chans}")
    limit = max_pixels or Image.MAX_IMAGE_PIXELS
    try:
        if isinstance(src, str):
            _check_regular(src)
            with open(src, "rb") as f:  # read once; nothing is left open whatever happens next
                src = f.read()
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(src))
            if limit and img.width * img.height > limit:
                raise BadImageError(
                    f"{label}: refused as a decompression bomb: declares {img.width}x{img.height} = "
                    f"{img.width * img.height} pixels, limit {limit}"
                )
            img.load()
            img = ImageOps.exif_transpose(img)
    except BadImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadImageError(f"{label}: refused as a decompression bomb ({e})") from e
    except UnidentifiedImageError as e:
        raise BadImageError(f"{label}: not an image file PIL can identify") from e
    except FileNotFoundError as e:
        raise BadImageError(f"{label}: file not found") from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # truncated / corrupt streams
        raise BadImageError(f"{label}: corrupt or truncated image ({e})") from e
    return to_mode(img, "L" if in_chans == 1 else "RGB")


def to_mode(img: Image.Image, mode: str) -> Image.Image:
    """Convert any PIL mode to "L" or "RGB" (alpha dropped as torchvision's loader does)."""
    if img.mode == mode:
        return img
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # palette transparency goes through RGBA, as PIL asks
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float32)
        if img.mode.startswith("I;16") or (img.mode == "I" and a.max(initial=0) > 255):
            a = a / 257.0  # 16-bit -> 8-bit
        elif img.mode == "F" and a.max(initial=0) <= 1.0:
            a = a * 255.0
        img = Image.fromarray(np.clip(np.round(a), 0, 255).astype(np.uint8), "L")
    return img.convert(mode)


def _check_regular(path: str) -> None:
    """Raise BadImageError unless `path` is a regular file (or a link to one): opening a FIFO blocks forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # open() says so, as before
    except OSError as e:
        raise BadImageError(f"{path}: cannot be read ({e.strerror})") from e
    if not stat.S_ISREG(mode):
        raise BadImageError(f"{path}: not a regular file ({stat.filemode(mode)}): never opened")


def verify_image(path: str, *, max_pixels: int | None = None) -> str | None:
    """Cheap up-front check (header + PIL verify, no full decode). Returns the reason it is bad, or None."""
    limit = max_pixels or Image.MAX_IMAGE_PIXELS
    try:
        _check_regular(path)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if limit and img.width * img.height > limit:
                    return f"refused as a decompression bomb: declares {img.width}x{img.height} pixels, limit {limit}"
                img.verify()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        return f"refused as a decompression bomb ({e})"
    except BadImageError as e:
        return e.reason
    except UnidentifiedImageError:
        return "not an image file PIL can identify"
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        return f"corrupt or truncated image ({e})"
    return None


def train_transform(cfg: DataConfig, img_size, in_chans: int) -> T.Compose:
    """uint8 image tensor (C, H, W) -> augmented, normalised float32 (C, h, w)."""
    hw = to_hw(img_size)
    ops: list[T.Transform] = []
    if cfg.inception_crop:
        ops.append(T.RandomResizedCrop(hw, scale=cfg.crop_scale, ratio=cfg.crop_ratio, antialias=True))
    else:
        ops.append(T.Resize(hw, antialias=True))
    if cfg.hflip:
        ops.append(T.RandomHorizontalFlip())
    ra = randaugment_op(cfg.randaugment)
    if ra is not None:
        ops.append(ra)
    mean, std = norm_stats(cfg.normalize, in_chans)
    ops += [T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)]
    if cfg.random_erasing > 0:
        ops.append(T.RandomErasing(cfg.random_erasing, scale=cfg.erasing_scale, ratio=cfg.erasing_ratio,
                                   value="random" if cfg.erasing_value == "random" else 0.0))
    return T.Compose(ops)


def eval_transform(img_size, in_chans: int, *, normalize: str = "inception", resize: str = "resize",
                   crop_fraction: float = 0.875) -> T.Compose:
    """uint8 image tensor (C, H, W) -> deterministic normalised float32 (C, h, w)."""
    hw = to_hw(img_size)
    if resize == "resize":
        ops: list[T.Transform] = [T.Resize(hw, antialias=True)]  # squash the whole image (paper fine-tuning)
    else:
        short = round(min(hw) / crop_fraction)
        ops = [T.Resize(short, antialias=True), T.CenterCrop(hw)]
    mean, std = norm_stats(normalize, in_chans)
    return T.Compose([*ops, T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)])


_INTERPOLATION = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC,
                  "nearest": T.InterpolationMode.NEAREST}


class _Channels(T.Transform):
    """PIL image of any mode, or uint8 (C, H, W) -> the channels `Preprocess.channels` asks for."""

    def __init__(self, channels: str):
        super().__init__()
        self.channels = channels

    def forward(self, img: Any) -> Any:  # type: ignore[override]
        if isinstance(img, Image.Image):
            if img.getexif().get(0x0112, 1) != 1:  # EXIF orientation: upright, as every vitlab reader gives it
                img = ImageOps.exif_transpose(img)
            img = to_mode(img, "RGB" if self.channels == "rgb" else "L")
            return img.convert("RGB") if self.channels == "grey_to_rgb" else img
        if not isinstance(img, torch.Tensor) or img.ndim != 3:
            raise TypeError(f"expected a PIL image or a (C, H, W) tensor, got {type(img).__name__}")
        c = img.shape[0]
        if self.channels == "rgb" and c == 1:
            return img.expand(3, -1, -1)
        if self.channels != "rgb" and c == 3:  # ITU-R 601-2 luma, PIL's "L" conversion
            grey = (0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]).round().to(img.dtype)[None]
            img = grey
        if self.channels == "grey_to_rgb":
            return img.expand(3, -1, -1) if img.shape[0] == 1 else img
        return img


def preprocess_transform(p: Preprocess) -> T.Compose:
    """The eval transform `p` describes: PIL image (any mode) or uint8 (C, H, W) -> float32 (C, H, W).

    The resize runs on the PIL image when given one, so the result is what torchvision's `weights.transforms()`,
    timm's `create_transform` and transformers' image processors compute from the same PIL image (turned upright
    first when its EXIF orientation says so, as `decode_image` does for files)."""
    interp = _INTERPOLATION[p.interpolation]
    hw, big = p.hw, p.resize_size
    ops: list[Any] = [_Channels(p.channels)]
    if p.resize == "resize":  # squash to img_size / crop_fraction, aspect ratio ignored
        ops.append(T.Resize(big, interpolation=interp, antialias=True))
        if big != hw:
            ops.append(T.CenterCrop(hw))
    else:  # shorter side to floor(side / crop_fraction), aspect ratio kept, centre crop
        ops += [T.Resize(min(big), interpolation=interp, antialias=True), T.CenterCrop(hw)]
    ops += [T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize(list(p.mean), list(p.std)),
            T.ToPureTensor()]
    return T.Compose(ops)


def transforms_for(source: Any, **overrides: Any) -> T.Compose:
    """The eval transform for a model, a checkpoint, or a `Preprocess`, as timm's `resolve_data_config` +
    `create_transform` give it.

    Args:
        source: A vitlab model (its `preprocess` at its `cfg.img_size`), a checkpoint path (its stored or
            conventional preprocessing), a `vitlab.weights.Checkpoint`, a `Preprocess`, or a dict of its fields.
        overrides: Preprocess fields that win over the source's (e.g. interpolation="bicubic").

    Returns:
        PIL image or uint8 (C, H, W) -> normalised float32 (C, H, W). Unknown preprocessing gives the default
        ([-1, 1], whole image, bilinear) and one PreprocessWarning.
    """
    return preprocess_transform(preprocess_of(source, **overrides))


def preprocess_of(source: Any, preprocess: Preprocess | Mapping[str, Any] | None = None, *, what: str | None = None,
                  **overrides: Any) -> Preprocess:
    """The resolved Preprocess of what `transforms_for` accepts (see there). `preprocess` (a whole Preprocess, or
    some of its fields) and `overrides` (fields) win over the source's own; `what` names it in the warning.

    Raises:
        ValueError: An override that is no Preprocess field (naming it and the valid ones), or a bad value.
    """
    if isinstance(preprocess, Preprocess):
        return preprocess.replace(**overrides) if overrides else preprocess
    overrides = {**(preprocess or {}), **overrides}
    if isinstance(source, Preprocess):
        return resolve(source, overrides=overrides)
    if isinstance(source, Mapping):
        return Preprocess.from_dict({**source, **overrides})
    if isinstance(source, str | Path):  # a path or any name vitlab.weights.hub.resolve takes
        return resolved_preprocess(source, overrides, what=what)
    cfg = getattr(source, "cfg", None)
    if hasattr(source, "state") and hasattr(source, "format"):  # a Checkpoint
        size = source.config.img_size if source.config is not None else source.known.get("img_size")
        return resolve(source.preprocess, img_size=size, overrides=overrides, what=what or str(source.source))
    if cfg is None or not hasattr(cfg, "img_size"):
        raise TypeError(f"transforms_for takes a model, a checkpoint path, a Checkpoint or a Preprocess, got "
                        f"{type(source).__name__}")
    return resolve(getattr(source, "preprocess", None), img_size=cfg.img_size, in_chans=cfg.in_chans,
                   overrides=overrides, what=what or f"this {type(source).__name__}")


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL "L"/"RGB" -> uint8 (C, H, W)."""
    a = np.asarray(img, dtype=np.uint8)
    a = a[:, :, None] if a.ndim == 2 else a
    return torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous()


def load_images(paths: Sequence[str], *, img_size: int | tuple[int, int], in_chans: int, normalize: str = "inception",
                resize: str = "resize", max_pixels: int | None = None,
                preprocess: Preprocess | None = None) -> torch.Tensor:
    """Image files -> float32 (B, C, H, W), decoded and resized as evaluation does (for predict / analyze).

    `preprocess` (e.g. `vitlab.data.preprocess_of(model)`) says how; without it, `normalize` / `resize` with a
    0.875 centre crop for "center_crop" and bilinear resizing, as the dataset pipelines do. All the images are held
    at once (0.6 MB each at 224 px): for many files, `image_batches` gives them a bounded batch at a time.

    Raises:
        BadImageError: Naming the first file that is missing, not an image, corrupt, or too large.
    """
    if isinstance(paths, str):
        paths = [paths]
    return next(image_batches(paths, max(1, len(paths)), img_size=img_size, in_chans=in_chans, normalize=normalize,
                              resize=resize, max_pixels=max_pixels, preprocess=preprocess))


def image_batches(
    paths: Sequence[str],
    batch_size: int,
    *,
    img_size: int | tuple[int, int],
    in_chans: int,
    normalize: str = "inception",
    resize: str = "resize",
    max_pixels: int | None = None,
    preprocess: Preprocess | None = None,
) -> Iterator[torch.Tensor]:
    """`load_images`, streamed: float32 (b, C, H, W) batches of at most `batch_size` images, in order, each decoded
    only when the previous one has been taken, so that memory does not grow with the number of files.

    Every path is checked to exist (and not be a folder) before the first image is decoded.

    Raises:
        BadImageError: Naming the first file that is missing, not an image, corrupt, or too large (a missing file
            before any batch; a file that fails to decode when its batch is made).
    """
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise ValueError("load_images needs at least one path")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if preprocess is None:
        preprocess = from_stats(normalize, img_size, in_chans, resize=resize,
                                crop_fraction=0.875 if resize == "center_crop" else 1.0)
    if preprocess.in_chans != in_chans:
        raise ValueError(f"preprocessing gives {preprocess.in_chans} channel(s) ({preprocess.channels}) but the "
                         f"model takes in_chans={in_chans}")
    for p in paths:
        if os.path.isdir(p):
            raise BadImageError(f"{p}: is a directory, not an image file")
        if not os.path.exists(p):
            raise BadImageError(f"{p}: no such file")
    tf = preprocess_transform(preprocess)
    return (torch.stack([tf(decode_image(p, in_chans, max_pixels=max_pixels)) for p in paths[s: s + batch_size]])
            for s in range(0, len(paths), batch_size))  # (b, C, H, W) each
