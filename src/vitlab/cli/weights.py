"""`vitlab weights list | show NAME | get NAME`: the registry of pretrained checkpoints, and fetching one."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ._common import HelpFormatter, UsageError, add_output, add_progress, add_verbosity, check_output, want_progress

HELP = "pretrained checkpoints: list the registry, show one, get (download) one"
DESCRIPTION = """\
The registry of pretrained checkpoints (Google's vit_jax and AugReg, torchvision, timm, transformers): list it,
show everything about one (preprocessing, licence, reported accuracy, cache path; no download), or get one
(download once, verify its checksum, print its local path). Any NAME also works wherever vitlab takes a
checkpoint (`vitlab predict NAME ...`, `vitlab.load_model(NAME)`)."""
EXAMPLES = """\
  vitlab weights list                                        # name, variant, resolution, classes, accuracy
  vitlab weights list --family dinov2                        # one model family (clip, siglip, deit3, mae, ...)
  vitlab weights show vit_b_16.IMAGENET1K_V1                 # every fact, the preprocessing, the cache path
  vitlab weights get hf-hub:google/vit-base-patch16-224 -o ckpt/   # download, verify, print the path"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", title="actions")
    sub.required = True
    ls = sub.add_parser("list", help="the registry as a table", description="the registry as a table",
                        formatter_class=HelpFormatter)
    ls.add_argument("--json", action="store_true", help="print every entry as JSON")
    ls.add_argument("--family", metavar="NAME", help="only this model family: vit, augreg, swag, bit, deit, deit3, "
                    "mae, dinov2, clip, siglip, siglip2, eva02, dinov3")
    show = sub.add_parser("show", help="all facts about a checkpoint and whether it is cached",
                          description="all facts about a checkpoint and whether it is cached (no download)",
                          formatter_class=HelpFormatter)
    show.add_argument("name", help="registry name or alias, hf-hub:owner/repo, gs:// or https URL, or a path")
    show.add_argument("--json", action="store_true", help="print JSON")
    get = sub.add_parser("get", help="download and verify a checkpoint, print its local path",
                         description="download and verify a checkpoint (once; cached), print its local path",
                         formatter_class=HelpFormatter)
    get.add_argument("name", help="registry name or alias, hf-hub:owner/repo, gs:// or https URL")
    add_output(get, "put the files in this folder instead of leaving them in the cache", metavar="DIR")
    add_progress(get)
    for action in (ls, show, get):
        add_verbosity(action)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(args.json, args.family)
    if args.action == "show":
        return _show(args.name, args.json)
    return _get(args.name, args.output, progress=want_progress(args))


def _entries() -> list[Any]:
    from ..weights import registry

    return list(registry.list_entries())


def _entry_dict(entry: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(entry) and not isinstance(entry, type):
        return dataclasses.asdict(entry)
    return dict(vars(entry))


def _accuracy(entry: Any) -> str:
    acc = entry.accuracy
    if not acc:
        return "-"
    metric = str(acc.get("metric", ""))
    return f"{acc.get('value')} ({metric})" if metric else str(acc.get("value"))


def _res(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "x".join(str(v) for v in value)
    return "-" if value is None else str(value)


_NAME_WIDTH = 56


def _list(as_json: bool, family: str | None = None) -> int:
    entries = _entries()
    if family is not None:
        from ..weights.registry import FAMILIES

        known = sorted({str(e.family) for e in entries if getattr(e, "family", None)} | set(FAMILIES))
        if family not in known:
            raise UsageError(f"--family {family!r} is not a model family of the registry; families: "
                             f"{', '.join(known)}")
        entries = [e for e in entries if getattr(e, "family", None) == family]
    if as_json:
        print(json.dumps([_entry_dict(e) for e in entries], indent=2))
        return 0
    header = ("name", "variant", "res", "classes", "labels", "reported accuracy")
    rows = [(e.name, e.variant or "-", _res(e.img_size), _res(e.num_classes), e.labels or "-", _accuracy(e))
            for e in entries]
    # a name longer than _NAME_WIDTH gets a line of its own, so one AugReg file name does not widen every row
    widths = [min(max(len(str(r[i])) for r in [header, *rows]), _NAME_WIDTH if i == 0 else 1 << 10)
              for i in range(len(header) - 1)]
    for r in [header, *rows]:
        if len(str(r[0])) > widths[0]:
            print(r[0])
            r = ("", *r[1:])
        print("  ".join(f"{c!s:<{w}}" for c, w in zip(r, widths)) + "  " + str(r[-1]))
    print(f"{len(rows)} checkpoints; `vitlab weights show NAME` for one's preprocessing, licence and cache path")
    return 0


def _show(name: str, as_json: bool) -> int:
    from ..weights import hub

    loc, entry = hub.locate(name)
    if entry is None and loc.kind == "hub" and not hub.cache_status(loc)["cached"]:
        # a Hub id we know nothing of: most often a misspelt registry name (show never downloads)
        print(f"vitlab weights show: {name!r} is not in the registry and not in the Hugging Face cache"
              f"{hub.close_names(name)}; `vitlab weights get {name}` fetches a Hub repo that is not listed",
              file=sys.stderr)
        return 1
    facts: dict[str, Any] = _entry_dict(entry) if entry is not None else {"name": name, "registry": False}
    facts["location"] = {k: v for k, v in dataclasses.asdict(loc).items() if v is not None and k != "text"}
    facts["location"] = {k: str(v) for k, v in facts["location"].items()}
    pre = hub.entry_preprocess(entry)
    if pre is not None:
        facts["preprocess"] = pre.to_dict()
    facts["cache"] = hub.cache_status(loc)
    if as_json:
        print(json.dumps(facts, indent=2, default=str))
        return 0
    for key, value in facts.items():
        if key == "preprocess" and pre is not None:
            value = pre.describe()
        elif key == "accuracy" and value:
            value = f"{value.get('value')} {value.get('metric', '')} (source: {value.get('source', '?')})"
        elif key == "cache":
            value = f"{value['path']} ({'cached' if value['cached'] else 'not downloaded yet'})"
        elif key == "location":
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif isinstance(value, list | tuple):
            value = ", ".join(str(v) for v in value) or "-"
        print(f"{key + ':':<15}{'-' if value is None else value}")
    return 0


def _get(name: str, output: str | None, *, progress: bool) -> int:
    from ..weights import hub

    if output is not None:
        check_output(output, folder=True)
        resolved = hub.fetch_to(name, output, progress=progress)
    else:
        resolved = hub.resolve(name, progress=progress)
    print(resolved.path)
    return 0
