"""Request bodies -> images -> the model's input, each failure a `RequestError` with its HTTP status and kind.

Nothing here trusts the request: the body is counted while it streams in (413 past the limit, before the rest is
read), multipart is parsed in memory within that limit, PIL may open only the formats the API promises
(`config.ALLOWED_FORMATS`), an image's declared size is checked against `max_pixels` before any pixel is decoded
(the decompression-bomb check), the whole image is decoded inside the check (a truncated file fails here, never in
a batch), EXIF orientation is applied, and the checkpoint's own preprocessing (`vitlab.data.preprocess_transform`)
turns it into the tensor the model takes. Error messages are written here, never copied from an exception, so no
file-system path, memory address or traceback reaches a client.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from ..data.images import preprocess_transform, to_mode
from ..models.preprocess import Preprocess
from .config import ALLOWED_FORMATS

__all__ = ["ImageInput", "Preparer", "RequestError", "read_body", "split_body"]

# Content types a raw body may declare (image/* of the allowed formats, or untyped bytes).
RAW_TYPES = frozenset({"image/jpeg", "image/jpg", "image/pjpeg", "image/png", "image/webp", "image/bmp",
                       "image/x-ms-bmp", "image/tiff", "image/gif", "application/octet-stream"})


Image.init()  # every plugin registered now: `Image.open(formats=...)` looks the allowed ones up by name
_FORMATS = tuple(f for f in ALLOWED_FORMATS if f in Image.OPEN)  # those this Pillow build reads


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, a short machine-readable `kind`, a message for people."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


@dataclass
class ImageInput:
    """One image of a request: its encoded bytes and what to call it in messages (`image 1`, or the uploaded
    file's name)."""

    data: bytes
    label: str
    filename: str | None = None


async def read_body(headers: Any, stream: AsyncIterator[bytes], limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to be over `limit` bytes: from Content-Length before
    reading anything, else while counting the streamed chunks."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(400, "bad_request", "Content-Length is not a number") from None
        if size > limit:
            raise RequestError(413, "body_too_large", f"the body is {size} bytes; the limit is {limit}")
    chunks, total = [], 0
    async for chunk in stream:
        total += len(chunk)
        if total > limit:
            raise RequestError(413, "body_too_large", f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


async def split_body(headers: Any, body: bytes, max_images: int) -> list[ImageInput]:
    """The images of a request: a raw body (image/*, application/octet-stream, or no Content-Type) is one image; a
    multipart/form-data body is every file part, in order (the batch form)."""
    content_type = headers.get("content-type") or ""
    media = _media_type(content_type)
    if media == "multipart/form-data":
        images = await _multipart(headers, body)
    elif media in RAW_TYPES or media == "" or (media.startswith("image/") and media != "image/svg+xml"):
        images = [ImageInput(body, "image 1")]
    else:
        raise RequestError(415, "unsupported_media_type",
                           f"Content-Type {media!r} is not accepted: send the image bytes as image/* or "
                           "application/octet-stream, or images as multipart/form-data file parts")
    if not images:
        raise RequestError(400, "no_image", "the multipart form holds no file part")
    if len(images) > max_images:
        raise RequestError(413, "too_many_images", f"{len(images)} images in one request; the limit is {max_images}")
    for image in images:
        if not image.data:
            raise RequestError(400, "empty_body", f"{image.label}: no bytes")
    return images


async def _multipart(headers: Any, body: bytes) -> list[ImageInput]:
    """File parts of a multipart/form-data body, parsed in memory (the body is already within the size limit)."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    class InMemory(MultiPartParser):
        spool_max_size = len(body) + 1  # never spill to a temporary file: the body is bounded already

    async def once() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await InMemory(headers, once(), max_files=1000, max_fields=1000).parse()
    except MultiPartException as e:
        raise RequestError(400, "bad_multipart", f"malformed multipart/form-data body ({e})") from None
    except Exception:  # python-multipart's own parse errors, a missing boundary (KeyError), bad headers
        raise RequestError(400, "bad_multipart", "malformed multipart/form-data body") from None
    out: list[ImageInput] = []
    try:
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                data = await value.read()
                name = _safe_name(value.filename)
                out.append(ImageInput(data, f"image {len(out) + 1}" + (f" ({name})" if name else ""), name))
    finally:
        await form.close()
    return out


def _safe_name(name: str | None) -> str | None:
    """An uploaded file's base name, printable and short, for messages and answers."""
    if not name:
        return None
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if c.isprintable())[:100]
    return base or None


def open_image(data: bytes, label: str, in_chans: int, max_pixels: int) -> Image.Image:
    """Check and fully decode one encoded image into mode "L" or "RGB", upright (EXIF orientation applied)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img: Image.Image = Image.open(io.BytesIO(data), formats=_FORMATS)
        except UnidentifiedImageError:
            raise RequestError(400, "not_an_image",
                               f"{label}: not an image this server reads (JPEG, PNG, WebP, BMP, TIFF, GIF)") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise RequestError(400, "too_many_pixels",
                               f"{label}: refused before decoding: too many pixels (limit {max_pixels})") from None
        except (OSError, SyntaxError, ValueError, EOFError, TypeError):
            raise RequestError(400, "corrupt_image", f"{label}: corrupt image header") from None
        if img.width * img.height > max_pixels:
            raise RequestError(400, "too_many_pixels", f"{label}: refused before decoding: {img.width}x{img.height} "
                               f"= {img.width * img.height} pixels, over the limit of {max_pixels}")
        if img.width < 1 or img.height < 1:
            raise RequestError(400, "corrupt_image", f"{label}: the image has no pixels")
        try:
            img.load()  # the whole image now: a truncated file fails here
            img = ImageOps.exif_transpose(img)
            return to_mode(img, "L" if in_chans == 1 else "RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise RequestError(400, "too_many_pixels", f"{label}: refused: too many pixels") from None
        except (OSError, SyntaxError, ValueError, EOFError, TypeError, IndexError, KeyError):
            raise RequestError(400, "corrupt_image", f"{label}: corrupt or truncated image data") from None


class Preparer:
    """Encoded image -> the model's (C, H, W) float32 input, as the checkpoint's preprocessing says."""

    def __init__(self, pre: Preprocess, max_pixels: int):
        self.pre = pre
        self.max_pixels = max_pixels
        self.transform: Callable[[Any], torch.Tensor] = preprocess_transform(pre)

    def __call__(self, image: ImageInput) -> np.ndarray:
        img = open_image(image.data, image.label, self.pre.in_chans, self.max_pixels)
        img = self._bounded(img)
        with torch.inference_mode():
            x = self.transform(img)  # (C, H, W) float32, normalised
        return x.numpy()

    def _bounded(self, img: Image.Image) -> Image.Image:
        """Crop the part of a very long image that a shorter-side resize + centre crop would keep, first: resizing a
        40000x1 image's short side to 256 px would otherwise make a 10-gigapixel intermediate. Ordinary images (the
        resized long side under 4x the input) pass untouched, so they get exactly the checkpoint's pipeline."""
        if self.pre.resize == "resize":  # squash: the resize goes straight to the input size
            return img
        h_out, w_out = self.pre.hw
        short = min(self.pre.resize_size)
        scale = short / min(img.width, img.height)
        if max(img.width, img.height) * scale <= 4 * max(h_out, w_out):
            return img
        margin = 4  # source pixels beyond the kept region: the resampling filter's reach
        keep_w = min(img.width, math.ceil(w_out / scale) + 2 * margin)
        keep_h = min(img.height, math.ceil(h_out / scale) + 2 * margin)
        left, top = (img.width - keep_w) // 2, (img.height - keep_h) // 2
        return img.crop((left, top, left + keep_w, top + keep_h))

    def view(self, x: np.ndarray) -> bytes:
        """The model's input back as a PNG (normalisation undone): what the page draws the rollout over."""
        mean = np.asarray(self.pre.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.pre.std, dtype=np.float32)[:, None, None]
        pixels = np.clip((x * std + mean) * 255.0 + 0.5, 0, 255).astype(np.uint8)  # (C, H, W)
        img = Image.fromarray(pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()
