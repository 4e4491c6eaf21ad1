"""`DataError`: the one error type of vitlab's dataset readers (IDX, CIFAR binary, image folders, WebDataset shards).

A malformed or unreadable data file raises DataError, never the reader's internals (EOFError, IndexError,
struct.error, zlib.error, tarfile.ReadError, ...). It subclasses ValueError, so code written for the older
`except ValueError` still catches it. A missing file is still FileNotFoundError; a single bad image or tar member
inside a folder or shard is `BadImageError`, a DataError subclass: skipped and counted unless data.strict is set.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file that cannot be used as it is.

    Attributes:
        path: The file (or shard) at fault.
        reason: What is wrong with it, in words.
    """

    def __init__(self, path: str, reason: str | None = None):
        if reason is None:  # one preformatted message, "PATH: REASON" (how BadImageError is raised)
            head, sep, tail = str(path).partition(": ")
            path, reason = (head, tail) if sep else ("", head)
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path, self.reason = str(path), reason
