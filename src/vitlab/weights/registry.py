"""The registry of official ViT checkpoints: one table of facts (`registry.json`), not code per checkpoint.

    from vitlab.weights import registry
    e = registry.get("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    e.variant, e.config, e.preprocess, e.accuracy        # "ViT-B/16", {"num_classes": 1000, ...}, ...
    registry.find("https://download.pytorch.org/models/vit_b_16-c867db91.pth")   # by name, alias or URL
    print(registry.markdown_table())                     # the table in docs/weights.md

Every entry says where the bytes are, in which format, which vitlab variant and config overrides build the model,
the preprocessing the weights were trained and evaluated with, the label set, the accuracy its publisher reports
(with the source), the licence and a checksum where the publisher gives one. Where a fact could not be found it
is null and the entry's notes say so. The JSON is validated when first read: an unknown variant, a config that
does not build, or a preprocessing block `vitlab.models.preprocess.Preprocess` rejects raises `WeightsError` naming the
entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ..models.config import VARIANTS, ViTConfig
from ..models.preprocess import Preprocess
from ..models.resnet import VARIANTS as BIT_VARIANTS
from ..models.resnet import ResNetConfig, config_from_name
from .report import WeightsError

REGISTRY_PATH = Path(__file__).with_name("registry.json")
FORMATS = ("npz", "big_vision", "hf", "timm", "torchvision")
# "image-text-embedding": the head is a CLIP / SigLIP projection into the joint image-text space, not classes
LABELS = ("imagenet-1k", "imagenet-21k", "imagenet-21k-winter", "image-text-embedding")
# the model family (paper) of an entry's weights: `vitlab weights list --family dinov2`
FAMILIES = ("vit", "augreg", "swag", "bit", "deit", "deit3", "mae", "dinov2", "clip", "siglip", "siglip2", "eva02",
            "dinov3")
_FIELDS = ("name", "aliases", "url", "filename", "format", "variant", "family", "config", "num_classes", "img_size",
           "preprocess", "labels", "accuracy", "license", "sha256", "sha256_prefix", "publisher", "notes")
# the fields a config must state when its variant is not one of vitlab's named ones ("ViT-So400m/14")
_SHAPE = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size")
_VARIANT_LABEL = re.compile(r"ViT-[A-Za-z0-9+.]+/\d+")
_HEX = re.compile(r"[0-9a-f]+")
_GCS = "https://storage.googleapis.com/"


@dataclass(frozen=True)
class Entry:
    """One checkpoint (the fields of one `registry.json` object).

    Attributes:
        name: Canonical name, the location string users type: "hf-hub:google/vit-base-patch16-224",
            "timm/<tag>", "gs://vit_models/...", "torchvision/ViT_B_16_Weights.IMAGENET1K_V1".
        aliases: Other names accepted by `find` / `get`.
        url: Where the bytes are: an https URL or "hf-hub:owner/repo".
        filename: For a Hub repo, the weights file to take; None otherwise.
        format: "npz" | "big_vision" | "hf" | "timm" | "torchvision".
        variant: The vitlab model name (a key of `vitlab.models.config.VARIANTS`, or of
            `vitlab.models.resnet.VARIANTS` for the BiT ResNets), or for a shape vitlab does not name, a label
            ("ViT-So400m/14", "ViT-g/14") whose config states embed_dim, depth, num_heads, mlp_dim and patch_size.
        family: The model family of the weights (FAMILIES: "vit", "deit3", "dinov2", "clip", ...).
        config: ViTConfig (ResNetConfig) overrides that build this checkpoint's model, num_classes and img_size
            included.
        num_classes: Classes of the head (0: no head).
        img_size: Input side the weights were trained / fine-tuned at.
        preprocess: `vitlab.models.preprocess.Preprocess` fields (see `to_preprocess`).
        labels: The head's label set ("imagenet-1k", "imagenet-21k", ...), None without a head.
        accuracy: {"metric", "value", "source"} as the publisher reports it, or None.
        license: The licence the publisher states for the weights (or what is known, in words).
        sha256: Full hex digest when the publisher gives one.
        sha256_prefix: A published digest prefix (torchvision's 8 hex digits in the file name).
        publisher: Who publishes the file.
        notes: Provenance, caveats, and the facts that could not be found.
    """

    name: str
    aliases: tuple[str, ...]
    url: str
    filename: str | None
    format: str
    variant: str
    family: str
    config: dict[str, Any] = field(hash=False)
    num_classes: int
    img_size: int
    preprocess: dict[str, Any] = field(hash=False)
    labels: str | None
    accuracy: dict[str, Any] | None = field(hash=False)
    license: str
    sha256: str | None
    sha256_prefix: str | None
    publisher: str
    notes: str

    def __hash__(self) -> int:
        return hash(self.name)

    def model_config(self, **overrides: Any) -> ViTConfig | ResNetConfig:
        """The ViTConfig (a BiT ResNet's: ResNetConfig) of this checkpoint's model (`overrides` win over the
        entry's)."""
        return _build(self.variant, {**self.config, **overrides})

    def to_preprocess(self) -> Preprocess:
        """The preprocessing as a `Preprocess`."""
        return Preprocess.from_dict(self.preprocess)

    def to_dict(self) -> dict[str, Any]:
        """The entry as the JSON object it came from (config without the num_classes / img_size it repeats)."""
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        d["config"] = {k: v for k, v in self.config.items() if k not in ("num_classes", "img_size")}
        return d


def _build(variant: str, config: dict[str, Any]) -> ViTConfig | ResNetConfig:
    """A named variant with `config` over it, or a labelled shape ("ViT-So400m/14") built from `config` alone."""
    if variant in VARIANTS or variant in BIT_VARIANTS:
        return config_from_name(variant, **config)
    return ViTConfig.from_dict({**config, "name": variant})


# -- loading and validation -------------------------------------------------------------------------------------

def _check(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise WeightsError(f"{where}: {what}")


def _entry(raw: Any, where: str) -> Entry:
    _check(isinstance(raw, dict), where, f"expected an object, got {type(raw).__name__}")
    missing, unknown = sorted(set(_FIELDS) - set(raw)), sorted(set(raw) - set(_FIELDS))
    _check(not missing and not unknown, where, f"missing field(s) {missing}, unknown field(s) {unknown}; every entry "
                                              f"has exactly {list(_FIELDS)}")
    name = raw["name"]
    _check(isinstance(name, str) and name.strip() == name and name != "", where, f"bad name {name!r}")
    where = f"{where} ({name})"
    for key in ("url", "format", "variant", "license", "publisher"):
        _check(isinstance(raw[key], str) and raw[key] != "", where, f"{key} must be a non-empty string")
    _check(isinstance(raw["notes"], str), where, "notes must be a string")
    aliases = raw["aliases"]
    _check(isinstance(aliases, list) and all(isinstance(a, str) and a for a in aliases), where,
           "aliases must be a list of non-empty strings")
    _check(raw["format"] in FORMATS, where, f"format {raw['format']!r} is not one of {FORMATS}")
    extra = raw["config"]
    _check(isinstance(extra, dict), where, "config must be an object")
    labelled = _VARIANT_LABEL.fullmatch(raw["variant"]) is not None and set(_SHAPE) <= set(extra)
    _check(raw["variant"] in VARIANTS or raw["variant"] in BIT_VARIANTS or labelled, where,
           f"variant {raw['variant']!r} is not a vitlab variant ({', '.join([*VARIANTS, *BIT_VARIANTS])}), nor a "
           f"label like 'ViT-So400m/14' with a config stating {', '.join(_SHAPE)}")
    _check(raw["family"] in FAMILIES, where, f"family {raw['family']!r} is not one of {FAMILIES}")
    url = raw["url"]
    hub = url.startswith("hf-hub:")
    _check(hub or url.startswith("https://"), where, f"url {url!r} is neither https:// nor hf-hub:owner/repo")
    _check((raw["filename"] is not None) == hub, where,
           "filename names the file to take from a Hub repo (hf-hub: url) and is null otherwise")
    _check(raw["filename"] is None or isinstance(raw["filename"], str), where, "filename must be a string or null")
    nc, size = raw["num_classes"], raw["img_size"]
    _check(isinstance(nc, int) and not isinstance(nc, bool) and nc >= 0, where, f"bad num_classes {nc!r}")
    _check(isinstance(size, int) and not isinstance(size, bool) and size > 0, where, f"bad img_size {size!r}")
    _check(not {"num_classes", "img_size"} & set(extra), where,
           "config must not repeat num_classes / img_size (they are entry fields)")
    config = {"num_classes": nc, "img_size": size, **extra}
    try:
        _build(raw["variant"], config)
    except (TypeError, ValueError) as e:
        raise WeightsError(f"{where}: config {extra} does not build a {raw['variant']}: {e}") from e
    try:
        pre = Preprocess.from_dict(raw["preprocess"])
    except (TypeError, ValueError) as e:
        raise WeightsError(f"{where}: bad preprocess: {e}") from e
    _check(pre.hw == (size, size), where, f"preprocess.img_size {pre.img_size} differs from img_size {size}")
    _check(bool(pre.source), where, "preprocess.source must say where the facts come from")
    labels = raw["labels"]
    _check(labels is None or labels in LABELS, where, f"labels {labels!r} is not null or one of {LABELS}")
    _check((labels is None) == (nc == 0), where, "labels is null exactly when there is no head (num_classes 0)")
    acc = raw["accuracy"]
    if acc is not None:
        _check(isinstance(acc, dict) and set(acc) == {"metric", "value", "source"}, where,
               "accuracy must be null or {metric, value, source}")
        _check(isinstance(acc["value"], int | float) and 0 < acc["value"] <= 100, where,
               f"accuracy value {acc['value']!r} is not a percentage")
        _check(isinstance(acc["source"], str) and acc["source"] != "", where, "accuracy needs a source")
    for key, n in (("sha256", 64), ("sha256_prefix", None)):
        value = raw[key]
        _check(value is None or (isinstance(value, str) and _HEX.fullmatch(value) is not None
                                 and (len(value) == n if n else 8 <= len(value) < 64)), where,
               f"{key} must be null or {'64' if n else '8-63'} lowercase hex digits, got {value!r}")
    if raw["sha256"] and raw["sha256_prefix"]:
        _check(raw["sha256"].startswith(raw["sha256_prefix"]), where, "sha256_prefix is not a prefix of sha256")
    return Entry(name=name, aliases=tuple(aliases), url=url, filename=raw["filename"], format=raw["format"],
                 variant=raw["variant"], family=raw["family"], config=config, num_classes=nc, img_size=size,
                 preprocess=dict(raw["preprocess"]), labels=labels, accuracy=acc, license=raw["license"],
                 sha256=raw["sha256"], sha256_prefix=raw["sha256_prefix"], publisher=raw["publisher"],
                 notes=raw["notes"])


def _normal_url(text: str) -> str:
    """URLs compared as one: percent-escapes decoded, gs://bucket/key as its https form."""
    text = unquote(text.strip())
    if text.startswith("gs://"):
        text = _GCS + text[len("gs://"):]
    return text


class _Table:
    """The loaded registry with its lookup indices."""

    def __init__(self, entries: list[Entry], where: str) -> None:
        self.entries = entries
        self.by_key: dict[str, Entry] = {}
        self.by_url: dict[str, Entry] = {}
        for e in entries:
            for key in (e.name, *e.aliases):
                other = self.by_key.get(key)
                _check(other is None, where, f"{key!r} names both {other.name if other else ''!r} and {e.name!r}")
                self.by_key[key] = e
            url = _normal_url(e.url)
            other = self.by_url.get(url)
            _check(other is None, where,
                   f"url {e.url!r} of {e.name!r} is also the url of {other.name if other else ''!r}")
            self.by_url[url] = e
        self.folded: dict[str, list[Entry]] = {}
        for key, e in self.by_key.items():
            self.folded.setdefault(key.lower(), []).append(e)


def load(path: str | Path = REGISTRY_PATH) -> list[Entry]:
    """Read and validate a registry file (the package's own by default); raises WeightsError naming the entry."""
    return list(_table(str(path)).entries)


@functools.cache
def _table(path: str) -> _Table:
    where = Path(path).name
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path}: cannot read the registry: {e}") from e
    _check(isinstance(raw, list), where, "the registry is a JSON list of entries")
    return _Table([_entry(r, f"{where} entry {i}") for i, r in enumerate(raw)], where)


# -- lookup ------------------------------------------------------------------------------------------------------

def list_entries() -> list[Entry]:
    """Every entry, in the table's order."""
    return list(_table(str(REGISTRY_PATH)).entries)


def find(name_or_alias_or_url: str) -> Entry | None:
    """The entry with this name, alias or URL (gs:// and percent-escaped forms of a URL match too); else None.

    Names match exactly, or ignoring case when that picks one entry."""
    t = _table(str(REGISTRY_PATH))
    text = str(name_or_alias_or_url).strip()
    if text in t.by_key:
        return t.by_key[text]
    url = _normal_url(text)
    if url in t.by_url:
        return t.by_url[url]
    folded = t.folded.get(text.lower(), [])
    return folded[0] if len({e.name for e in folded}) == 1 else None


def get(name: str) -> Entry:
    """Like `find`, but an unknown name raises WeightsError listing the closest names."""
    entry = find(name)
    if entry is not None:
        return entry
    keys = list(_table(str(REGISTRY_PATH)).by_key)
    close = difflib.get_close_matches(str(name), keys, n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `vitlab weights list` shows them all"
    raise WeightsError(f"no registry entry named {name!r}{hint}")


# -- the docs table ----------------------------------------------------------------------------------------------

def _describe_preprocess(p: dict[str, Any]) -> str:
    pre = Preprocess.from_dict(p)
    h = pre.hw[0]
    stats = pre.normalize or f"mean {list(pre.mean)} std {list(pre.std)}"
    if pre.resize == "resize" and pre.crop_fraction == 1.0:
        how = f"squash to {h}"
    elif pre.resize == "resize":
        how = f"squash to {pre.resize_size[0]}, crop {h}"
    elif pre.crop_fraction == 1.0:
        how = f"short side {h}, crop {h}"
    else:
        how = f"short side {min(pre.resize_size)}, crop {h}"
    return f"{how}, {pre.interpolation}, {stats}"


# who reported an accuracy, from the start of its source (shown in the docs table; the full source is in the entry)
_REPORTERS = (("vision_transformer README", "Google"), ("timm ", "timm"), ("torchvision ", "torchvision"),
              ("facebookresearch/deit", "DeiT authors"), ("facebookresearch/dinov2", "DINOv2 authors"),
              ("open_clip ", "OpenCLIP"), ("big_vision ", "Google"))


def _reporter(source: str) -> str:
    return next((who for prefix, who in _REPORTERS if source.startswith(prefix)), "see entry")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(entries: list[Entry] | None = None) -> str:
    """The registry as a Markdown table (docs/weights.md carries this exact text; a test keeps them equal)."""
    rows = ["| name | family | variant | res | classes | preprocessing | reported top-1 | licence |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in entries if entries is not None else list_entries():
        if e.accuracy is None:
            accuracy = "-"
        else:
            metric = e.accuracy["metric"]
            accuracy = f"{e.accuracy['value']} ({_reporter(e.accuracy['source'])})"
            if metric != "imagenet-1k top-1":
                accuracy += f", {metric}"
        classes = f"{e.num_classes} ({e.labels})" if e.labels else "none (backbone)"
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{e.name}`", e.family, e.variant, e.img_size, classes, _describe_preprocess(e.preprocess), accuracy,
            e.license)) + " |")
    return "\n".join(rows) + "\n"
