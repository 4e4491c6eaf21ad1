"""What every `vitlab` command shares: the help formatter, the options spelled one way everywhere (--img-size,
--device, -o/--output, --force, -v/-q, --no-progress), the exit codes, and the one place that turns exceptions
into a message and an exit code.

Nothing here imports torch or vitlab's heavy modules: `vitlab --help` builds every parser from this module and the
command modules' `add_arguments`, which import only light ones.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from ..models.preprocess import INTERPOLATIONS, NAMED_STATS, RESIZE_MODES
from ..utils.extras import EXTRAS, MissingExtraError
from ..utils.io import OutputError, check_writable
from ..utils.progress import wants_progress

# -- exit codes: the one scheme of every command ----------------------------------------------------------------

OK = 0  # done
FAILED = 1  # the command line was fine but the work failed: a missing or unreadable checkpoint, image, dataset or
#             recipe, a value the library refused, an output that exists without --force, a missing extra
USAGE = 2  # the command line is wrong: unknown option, bad or missing value (argparse's code; also a value a
#            command checks itself before starting, e.g. --batch-size 0)
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), and SIGTERM: both stop a command the one way
BROKEN_PIPE = 141  # the reader of stdout went away, e.g. `vitlab weights list | head` (128 + SIGPIPE)

EXIT_CODES = (
    (OK, "success"),
    (FAILED, "error in the input, checkpoint, data or output (one line `vitlab COMMAND: error: ...` on stderr)"),
    (USAGE, "usage error: unknown option, bad or missing value (argparse's message)"),
    (INTERRUPTED, "interrupted (Ctrl-C or SIGTERM; `vitlab train` saves a checkpoint first: continue with "
                  "--resume)"),
    (BROKEN_PIPE, "output pipe closed by the reader (e.g. `| head`)"),
)


def exit_code_table() -> str:
    """The exit codes as the lines of `vitlab --help`'s epilog."""
    return "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES)


class UsageError(Exception):
    """A value on the command line that the command itself refuses before doing any work: exit code 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt (`terminate_as_interrupt`)."""


# -- the formatter: every option shows its default ------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and epilog's line breaks (the examples), and appends "(default: X)" to an option's
    help when it has a meaningful default the help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower():
            return text
        default = action.default
        if default in (None, False, argparse.SUPPRESS, []) or action.option_strings == []:
            return text
        if isinstance(default, list | tuple):
            default = " ".join(map(str, default))
        return f"{text} (default: {str(default).replace('%', '%%')})"


def add_parser(sub: Any, name: str, help_: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A sub-command parser with the shared formatter, a description and an examples epilog."""
    return sub.add_parser(name, help=help_, description=description, epilog=f"examples:\n{examples.rstrip()}",
                          formatter_class=HelpFormatter)


# -- options spelled one way in every command -------------------------------------------------------------------


def parse_img_size(text: str) -> int | tuple[int, int]:
    """`--img-size`: "N" (square) or "HxW" (also "H,W"); positive integers."""
    parts = text.lower().replace("x", ",").split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size must be N or HxW, got {text!r}") from None
    if len(sizes) not in (1, 2) or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"image size must be N or HxW with positive sides, got {text!r}")
    return sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])


def add_img_size(p: argparse.ArgumentParser, what: str, **kwargs: Any) -> None:
    p.add_argument("--img-size", type=parse_img_size, metavar="N|HxW", help=what, **kwargs)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="cpu, cuda, cuda:1, ... (default: cuda when available, else cpu)")


def add_output(p: argparse.ArgumentParser, what: str, *aliases: str, **kwargs: Any) -> None:
    """-o/--output; `aliases` are older spellings kept working but hidden from --help."""
    p.add_argument("-o", "--output", help=what, **kwargs)
    for alias in aliases:
        p.add_argument(alias, dest="output", help=argparse.SUPPRESS)


def add_force(p: argparse.ArgumentParser, what: str = "replace output files that already exist") -> None:
    p.add_argument("--force", action="store_true", help=what)


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (bars are drawn on stderr only when it is a terminal)")


MEMORY_POLICIES = ("bounded", "reuse")


def add_memory(p: argparse.ArgumentParser) -> None:
    """--memory: how an inference command over many images treats freed memory (`apply_memory`)."""
    p.add_argument("--memory", choices=MEMORY_POLICIES, default="bounded",
                   help="bounded: the peak resident memory stays that of one batch however many images (big blocks "
                        "get their own mappings and go back to the kernel when freed, so every batch pays their page "
                        "faults again); reuse: freed memory is kept for the next batch, faster (ViT-S/16 eval 1.5-1.6x "
                        "on a 2-core Zen 4) with a higher peak (882 -> 1115 MiB there). docs/speed.md, Memory")


def apply_memory(policy: str) -> bool:
    """Set this process's glibc allocator for `--memory` (vitlab.perf.allocator); True when applied. A no-op off
    Linux/glibc or when MALLOC_MMAP_THRESHOLD_ is set (the user's own setting wins)."""
    from ..perf.allocator import bounded_heap, keep_freed_memory

    if policy not in MEMORY_POLICIES:
        raise ValueError(f"--memory must be one of {', '.join(MEMORY_POLICIES)}, got {policy!r}")
    return bounded_heap() if policy == "bounded" else keep_freed_memory()


def add_verbosity(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-v/-q: the level of the `vitlab` loggers (INFO by default; -v DEBUG and tracebacks, -q WARNING, -qq ERROR).
    On sub-commands the default is SUPPRESS, so `vitlab -v eval ...` and `vitlab eval -v ...` both work."""
    extra: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-v", "--verbose", action="count", help="more log output: debug messages, tracebacks on errors",
                   **({"default": 0} if top else extra))
    p.add_argument("-q", "--quiet", action="count", help="less log output: -q warnings only, -qq errors only",
                   **({"default": 0} if top else extra))


def add_preprocess(p: argparse.ArgumentParser) -> None:
    """--normalize / --resize / --crop-fraction / --interpolation, shared by predict, eval, analyze, fewshot; read
    back by `preprocess_overrides` (vitlab.models.preprocess imports nothing heavy)."""
    p.add_argument("--normalize", choices=tuple(NAMED_STATS), default=None,
                   help="pixel statistics: inception ([-1, 1]) or imagenet (mean/std); default: the checkpoint's own "
                        "preprocessing")
    p.add_argument("--resize", "--eval-resize", choices=RESIZE_MODES, default=None, dest="pp_resize",
                   help="resize: squash the whole image to the model's size; center_crop: shorter side to "
                        "size / --crop-fraction, keep the centre. Default: the checkpoint's own")
    p.add_argument("--crop-fraction", type=float, default=None,
                   help="share of the resized image kept by the centre crop, in (0, 1]; implies --resize "
                        "center_crop unless --resize says otherwise")
    p.add_argument("--interpolation", choices=INTERPOLATIONS, default=None,
                   help="resampling filter; default: the checkpoint's own")


def preprocess_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `preprocess=` mapping of `add_preprocess`'s flags: the Preprocess fields they set (none given: {}, the
    checkpoint's own). A crop fraction without --resize means center_crop; --resize resize alone squashes the
    whole image (`vitlab.data.preprocess.named_overrides`)."""
    from ..data.preprocess import named_overrides

    return named_overrides(normalize=args.normalize, resize=args.pp_resize, crop_fraction=args.crop_fraction,
                           interpolation=args.interpolation)


def add_model_inputs(p: argparse.ArgumentParser, img_size_help: str) -> None:
    """What a command that runs a checkpoint on images takes besides its own options: --img-size, the
    preprocessing overrides, --device and --no-progress."""
    add_img_size(p, img_size_help)
    add_preprocess(p)
    add_device(p)
    add_progress(p)


def positive(name: str, value: int | float | None, *, minimum: float = 1) -> None:
    """UsageError unless `value` is None or >= minimum."""
    if value is not None and value < minimum:
        raise UsageError(f"{name} must be at least {minimum:g}, got {value}")


def want_progress(args: argparse.Namespace) -> bool:
    """A bar unless --no-progress or -q; and only on a terminal."""
    return wants_progress(not getattr(args, "no_progress", False) and not getattr(args, "quiet", 0))


# -- logging ----------------------------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (pytest's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


@contextlib.contextmanager
def logging_to_stderr(verbose: int = 0, quiet: int = 0) -> Iterator[None]:
    """Within the block, the `vitlab` logger hierarchy writes plain messages to stderr at the level -v/-q chose
    (INFO by default); afterwards the logger is as it was (main() may be called many times in one process)."""
    score = (verbose or 0) - (quiet or 0)
    level = logging.DEBUG if score > 0 else {0: logging.INFO, -1: logging.WARNING}.get(score, logging.ERROR)
    logger = logging.getLogger("vitlab")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s" if score > 0 else "%(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# -- errors -> messages and exit codes ---------------------------------------------------------------------------


def _import_message(e: ImportError) -> str:
    """The packaging helper's MissingExtraError already names the extra; for a plain ModuleNotFoundError of an
    optional module, name the extras that provide it."""
    if isinstance(e, MissingExtraError):
        return str(e)
    top = (e.name or "").partition(".")[0]
    extras = [extra for extra, modules in EXTRAS.items() if top in modules]
    if extras:
        return f"{e}; it comes with pip install 'vitlab[{extras[0]}]'"
    return str(e)


# errnos that only a write gives: an OSError with one of them is reported as "cannot write ..."
_WRITE_ONLY_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG") if hasattr(errno, n))


def _interrupted(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) behind `e`, if any: a library that ran Python code under C (torch.save's writer, a
    DataLoader) may turn the KeyboardInterrupt raised there into an error of its own, chained to it."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _interrupted_line(command: str, e: KeyboardInterrupt) -> str:
    return f"vitlab {command}: interrupted" + (" (SIGTERM)" if isinstance(e, Terminated) else "")


def error_message(e: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for the exceptions a command reports as one "error: ..." line; None for anything else
    (a bug: its traceback is shown).

    The one table:
        UsageError                                   -> 2, its message
        ImportError (MissingExtraError, a missing optional dependency) -> 1, the extra to install
        vitlab.utils.io.OutputError (disk full, read-only or unwritable folder, a file where a folder must be)
                                                     -> 1, "cannot write PATH: reason"
        OSError of a write (ENOSPC, EDQUOT, EROFS, EFBIG) -> 1, "cannot write FILE: reason"
        OSError with a file name (FileNotFoundError, PermissionError, IsADirectoryError, ...) -> 1, "FILE: reason"
        yaml.YAMLError (a recipe or --set value that is not YAML) -> 1, the parser's message
        ValueError (WeightsError, DataError, bad config values), TypeError, OSError, RuntimeError (a non-finite
        loss, an onnxruntime mismatch, a bad device string) -> 1, the message
    KeyboardInterrupt, also when a library wrapped it in an error of its own, is 130 (`run_command`).
    """
    if isinstance(e, UsageError):
        return USAGE, str(e)
    if isinstance(e, ImportError):
        return FAILED, _import_message(e)
    if isinstance(e, OutputError):
        return FAILED, str(e)
    if isinstance(e, OSError) and e.errno in _WRITE_ONLY_ERRNOS:
        reason = os.strerror(e.errno or 0)
        reason = reason[:1].lower() + reason[1:]
        return FAILED, f"cannot write {e.filename}: {reason}" if e.filename else f"cannot write output: {reason}"
    if isinstance(e, OSError) and e.strerror and e.filename:  # raised by open() & co: "[Errno 2] ..." is noise
        return FAILED, f"{e.filename}: {e.strerror}"
    if isinstance(e, ValueError | TypeError | OSError | RuntimeError):
        return FAILED, str(e) or type(e).__name__
    if type(e).__module__.partition(".")[0] == "yaml":  # yaml.YAMLError, without importing yaml here
        return FAILED, f"invalid YAML: {e}"
    return None


def check_output(path: str | os.PathLike[str] | None, *, folder: bool) -> None:
    """Refuse an output that could not be written before any work is done: `path` (a file, or with `folder` a
    folder to write into) whose place is a file, a read-only file system, a folder without write permission.
    Raises vitlab.utils.io.OutputError ("cannot write PATH: reason"); None is accepted (no output asked for)."""
    if path is not None:
        check_writable(path, folder=folder)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block (in the main thread), SIGTERM stops the work as Ctrl-C does: it raises `Terminated` (a
    KeyboardInterrupt), so every `finally` runs (temporary files and folders are removed, `vitlab.utils.io` holds
    it until a file being written is whole) and the command exits 130 with one line. Without it SIGTERM kills the
    process on the spot, leaving its temporary files. `vitlab train` sets its own handler while it trains (finish
    the step, save a checkpoint) and `vitlab serve` its own while it serves (drain the requests in flight)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _exit_on_late_interrupt(command: str, code: int) -> None:
    """From now on (the command has finished; the interpreter is shutting down), Ctrl-C or SIGTERM ends the program
    at once with exit code 130 and at most one line, instead of a traceback from whatever teardown it interrupts."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        with contextlib.suppress(Exception):
            if code != INTERRUPTED:
                print(f"vitlab {command}: interrupted", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(INTERRUPTED)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, handler)


def run_command(command: str, fn: Callable[[], int | None], verbose: int = 0, *, program: bool = False) -> int:
    """Run a command's work, turning the exceptions of `error_message` into one line on stderr and its code.

    Ctrl-C is exit code 130 and one line, "vitlab COMMAND: interrupted", also when a library turned it into an
    error of its own. With `program` (the `vitlab` executable, not a call from Python), SIGTERM is handled the same
    way (`terminate_as_interrupt`), and a Ctrl-C or SIGTERM after the work, while the process tears down, exits 130
    at once and quietly.
    """
    try:
        with _quiet_thread_write_errors(), terminate_as_interrupt() if program else contextlib.nullcontext():
            code = _run(command, fn, verbose)
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being reported
        code = INTERRUPTED
    if program:
        _exit_on_late_interrupt(command, code)
    return code


def ignore_interrupts_at_exit() -> None:
    """Register (call it first thing: atexit runs the last registered first) an exit hook that ignores SIGINT and
    SIGTERM for the rest of the interpreter's shutdown. Python resets its handlers to the default late in the
    shutdown, and a signal then kills the process (-2 or -15 to a parent process, not 130); an ignored one stays so."""
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            atexit.register(signal.signal, s, signal.SIG_IGN)


@contextlib.contextmanager
def _quiet_thread_write_errors() -> Iterator[None]:
    """Within the block, a background thread that dies of a full or read-only disk (TensorBoard's event writer)
    prints no traceback: the library hands its error to the main thread, which reports it as one line."""
    old = threading.excepthook

    def hook(args: Any) -> None:
        if isinstance(args.exc_value, OSError) and args.exc_value.errno in _WRITE_ONLY_ERRNOS:
            return
        old(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = old


def _flush_stdout() -> None:
    """Flush stdout now, so that a full disk under `vitlab eval --json > out.json` is reported like any other
    failed write, not as a traceback when Python flushes at exit (and the exit flush is not tried again)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        text = os.strerror(e.errno) if e.errno else str(e)
        raise OutputError("standard output", text[:1].lower() + text[1:], e.errno) from e


def _run(command: str, fn: Callable[[], int | None], verbose: int) -> int:
    try:
        code = int(fn() or OK)
        _flush_stdout()
        return code
    except KeyboardInterrupt as e:
        print(_interrupted_line(command, e), file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the reader left: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return BROKEN_PIPE
    except Exception as e:
        interrupt = _interrupted(e)
        if interrupt is not None:
            if verbose:
                traceback.print_exc(file=sys.stderr)
            print(_interrupted_line(command, interrupt), file=sys.stderr)
            return INTERRUPTED
        mapped = error_message(e)
        if mapped is None:
            raise
        code, message = mapped
        if verbose:
            traceback.print_exc(file=sys.stderr)
        first, *rest = message.strip().splitlines() or [""]
        print(f"vitlab {command}: error: {first}", file=sys.stderr)
        for line in rest:  # a multi-line message (a list of problems) stays readable
            print(f"  {line}", file=sys.stderr)
        return code
