"""Plain URL downloads against a real HTTP server started in the test: cache layout, resuming a dropped
connection with Range, a server that ignores Range, checksum failures, offline mode, concurrent callers."""

import hashlib
import http.server
import os
import re
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.weights import WeightsError, download, hub

from .conftest import perturb_


class LocalServer:
    """An http.server in a daemon thread on 127.0.0.1 (a free port); a context manager that starts and stops it."""

    def _serve(self, handler: type) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FileServer(LocalServer):
    """http.server in a thread serving `files` (URL path -> bytes), with per-path misbehaviour switches.

    Attributes:
        requests: (path, Range header or None) of every GET, in order.
        drop_once: Paths whose next GET sends half the body, then closes the connection.
        ignore_range: Paths always answered 200 with the whole file, whatever Range asks.
        fail_once: Path -> HTTP status sent on the next GET only.
        chunk_delay: Seconds between 16 KiB chunks (a slow server).
        etags: Path -> ETag sent with the file; a Range request whose If-Range differs gets the whole file (RFC 9110).
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.requests: list[tuple[str, str | None]] = []
        self.drop_once: set[str] = set()
        self.ignore_range: set[str] = set()
        self.fail_once: dict[str, int] = {}
        self.chunk_delay = 0.0
        self.etags: dict[str, str] = {}
        self.if_range: list[str | None] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path, rng = self.path, self.headers.get("Range")
                owner.requests.append((path, rng))
                if path in owner.fail_once:
                    self.send_error(owner.fail_once.pop(path))
                    return
                data = owner.files.get(path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                owner.if_range.append(self.headers.get("If-Range"))
                stale = self.headers.get("If-Range") not in (None, owner.etags.get(path))
                if rng and path not in owner.ignore_range and not stale:
                    start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                if path in owner.etags:
                    self.send_header("ETag", owner.etags[path])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if path in owner.drop_once:
                    owner.drop_once.discard(path)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                for i in range(0, len(body), 1 << 14):
                    self.wfile.write(body[i:i + (1 << 14)])
                    if owner.chunk_delay:
                        time.sleep(owner.chunk_delay)

            def log_message(self, *args):
                pass

        self._serve(Handler)

    def gets(self, path: str) -> list[str | None]:
        return [r for p, r in self.requests if p == path]


def payload(n: int = 300_000, seed: int = 0) -> bytes:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)).numpy() \
        .tobytes()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_registry(monkeypatch, entries=()):
    """Replace `vitlab.weights.registry` by a module holding `entries` (objects with the Entry fields), so
    tests neither depend on nor touch the shipped table."""
    import vitlab.weights

    entries = list(entries)

    def find(name):
        return next((e for e in entries if name == e.name or name in e.aliases or name == e.url), None)

    def get(name):
        e = find(name)
        if e is None:
            raise WeightsError(f"no registry entry {name!r}")
        return e

    fake = types.ModuleType("vitlab.weights.registry")
    fake.list_entries, fake.find, fake.get = lambda: list(entries), find, get
    monkeypatch.setitem(sys.modules, "vitlab.weights.registry", fake)
    monkeypatch.setattr(vitlab.weights, "registry", fake, raising=False)
    return fake


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    install_registry(monkeypatch)
    for var in ("VITLAB_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(download, "BACKOFF", 0.0)


def cache_files(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_download_is_cached_under_host_and_path(tmp_path):
    data = payload()
    with FileServer({"/models/a/w.bin": data}) as srv:
        url = srv.url("/models/a/w.bin")
        path = hub.resolve(url).path
        host = f"127.0.0.1_{srv.httpd.server_address[1]}"
        assert path == tmp_path / "cache" / host / "models" / "a" / "w.bin"
        assert path.read_bytes() == data
        assert hub.resolve(url).path == path
        assert srv.gets("/models/a/w.bin") == [None]  # the second call did not touch the network


def test_dropped_connection_is_resumed_by_the_next_call_with_range(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        srv.drop_once.add("/w.bin")
        url = srv.url("/w.bin")
        dest = download.url_cache_path(url)
        with pytest.raises(WeightsError, match=r"after 1 tries.*kept and the next call resumes it"):
            download.download_url(url, dest, sha256=sha(data), retries=0)
        part = dest.with_name("w.bin.part")
        assert not dest.exists() and part.stat().st_size == len(data) // 2
        assert download.download_url(url, dest, sha256=sha(data), retries=0).read_bytes() == data
        assert srv.gets("/w.bin") == [None, f"bytes={len(data) // 2}-"]
        assert not part.exists()


def test_dropped_connection_is_retried_within_one_call(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        srv.drop_once.add("/w.bin")
        path = hub.resolve(srv.url("/w.bin") + f"#sha256={sha(data)}").path
        assert path.read_bytes() == data
        assert srv.gets("/w.bin") == [None, f"bytes={len(data) // 2}-"]


def test_server_that_ignores_range_restarts_cleanly(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        srv.drop_once.add("/w.bin")
        srv.ignore_range.add("/w.bin")
        path = hub.resolve(srv.url("/w.bin") + f"#sha256={sha(data)}").path
        assert path.read_bytes() == data  # not the first half twice
        assert srv.gets("/w.bin") == [None, f"bytes={len(data) // 2}-"]


def test_a_file_changed_on_the_server_is_not_appended_to_the_old_part(tmp_path):
    old, new = payload(seed=1), payload(seed=2)
    with FileServer({"/w.bin": old}) as srv:
        srv.etags["/w.bin"] = '"v1"'
        srv.drop_once.add("/w.bin")
        url = srv.url("/w.bin")  # no checksum: only the ETag tells that the file changed
        with pytest.raises(WeightsError):
            download.download_url(url, download.url_cache_path(url), retries=0)
        srv.files["/w.bin"], srv.etags["/w.bin"] = new, '"v2"'
        assert hub.resolve(url).path.read_bytes() == new
        assert srv.gets("/w.bin") == [None, f"bytes={len(old) // 2}-"] and srv.if_range == [None, '"v1"']
        assert not any(f.endswith((".part", ".validator")) for f in cache_files(tmp_path))


def test_a_whole_part_file_is_verified_and_placed(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        url = srv.url("/w.bin")
        part = download.url_cache_path(url).with_name("w.bin.part")
        part.parent.mkdir(parents=True)
        part.write_bytes(data)  # a run that stopped between the last byte and the rename
        assert hub.resolve(url + f"#sha256={sha(data)}").path.read_bytes() == data
        assert srv.gets("/w.bin") == [f"bytes={len(data)}-"]  # answered 416, nothing sent again
        part.write_bytes(data + b"extra")  # longer than the file: not a prefix, downloaded again
        download.url_cache_path(url).unlink()
        assert hub.resolve(url + f"#sha256={sha(data)}").path.read_bytes() == data


def test_without_checksum_or_validator_a_partial_file_starts_over(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        srv.drop_once.add("/w.bin")
        assert hub.resolve(srv.url("/w.bin")).path.read_bytes() == data
        assert srv.gets("/w.bin") == [None, None]  # nothing could check a resumed file, so no Range


def test_progress_bar_on_a_terminal_only(tmp_path, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    data = payload(3 << 20)
    with FileServer({"/big.bin": data}) as srv:
        for tty, progress in ((True, True), (False, True), (True, False)):
            err = Terminal() if tty else io.StringIO()
            monkeypatch.setattr(sys, "stderr", err)
            download.download_url(srv.url("/big.bin"), tmp_path / f"{tty}-{progress}.bin", progress=progress)
            drawn = f"{tty}-{progress}.bin:" in err.getvalue() and "3.00M" in err.getvalue()
            assert drawn == (tty and progress), (tty, progress, err.getvalue())


def test_checksum_mismatch_leaves_nothing_in_the_cache(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        wrong = sha(data + b"x")
        with pytest.raises(WeightsError, match=f"checksum mismatch.*expected {wrong}; nothing was kept"):
            hub.resolve(srv.url("/w.bin") + f"#sha256={wrong}")
        assert [f for f in cache_files(tmp_path) if not f.endswith(".lock")] == []
        with pytest.raises(WeightsError, match="checksum mismatch"):  # and the next call does not trust anything
            hub.resolve(srv.url("/w.bin") + f"#sha256={wrong}")
        assert len(srv.gets("/w.bin")) == 2


def test_checksum_prefix_as_torchvision_gives_it(tmp_path):
    data = payload()
    with FileServer({"/vit-x.pth": data}) as srv:
        dest = tmp_path / "out" / "vit-x.pth"
        assert download.download_url(srv.url("/vit-x.pth"), dest, sha256=sha(data)[:8].upper()).read_bytes() == data
        with pytest.raises(WeightsError, match=r"checksum mismatch.*expected 00000000\.\.\."):
            download.download_url(srv.url("/vit-x.pth"), tmp_path / "other.pth", sha256="00000000")
        with pytest.raises(WeightsError, match="not a sha256 hex digest"):
            download.download_url(srv.url("/vit-x.pth"), tmp_path / "third.pth", sha256="xyz")


def test_file_placed_by_hand_is_checked_against_the_checksum(tmp_path):
    data = payload()
    with FileServer({"/w.bin": data}) as srv:
        url = srv.url("/w.bin")
        dest = download.url_cache_path(url)
        dest.parent.mkdir(parents=True)
        dest.write_bytes(data[:-1] + b"!")
        with pytest.raises(WeightsError, match=r"checksum mismatch.*delete the file"):
            hub.resolve(url + f"#sha256={sha(data)}")
        dest.write_bytes(data)
        assert hub.resolve(url + f"#sha256={sha(data)}").path == dest
        assert srv.requests == []


def test_transient_http_error_is_retried_and_client_error_is_not(tmp_path):
    data = payload(1000)
    with FileServer({"/w.bin": data}) as srv:
        srv.fail_once["/w.bin"] = 503
        assert hub.resolve(srv.url("/w.bin")).path.read_bytes() == data
        assert len(srv.gets("/w.bin")) == 2
        with pytest.raises(WeightsError, match="HTTP 404"):
            hub.resolve(srv.url("/missing.bin"))
        assert len(srv.gets("/missing.bin")) == 1
    assert [f for f in cache_files(tmp_path) if "missing" in f and not f.endswith(".lock")] == []


@pytest.mark.parametrize("var", ["VITLAB_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_with_nothing_cached_says_where_to_put_the_file(tmp_path, monkeypatch, var):
    with FileServer({"/dir/w.npz": b"x"}) as srv:
        monkeypatch.setenv(var, "1")
        url = srv.url("/dir/w.npz")
        with pytest.raises(WeightsError) as e:
            hub.resolve(url)
        expected = tmp_path / "cache" / f"127.0.0.1_{srv.httpd.server_address[1]}" / "dir" / "w.npz"
        assert f"put the file at {expected}" in str(e.value) and f"offline mode is on ({var}=1)" in str(e.value)
        assert srv.requests == []
        expected.parent.mkdir(parents=True)
        expected.write_bytes(b"x")  # doing what the message says works
        assert hub.resolve(url).path == expected


def test_unreachable_host_with_nothing_cached(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/w.bin"
    with pytest.raises(WeightsError, match=r"cannot be reached .* put the file at .*w\.bin"):
        hub.resolve(url)


def test_two_downloads_of_one_file_at_once(tmp_path):
    data = payload(400_000)
    with FileServer({"/w.bin": data}) as srv:
        srv.chunk_delay = 0.005
        url = srv.url("/w.bin") + f"#sha256={sha(data)}"
        results, errors = [], []

        def get():
            try:
                results.append(hub.resolve(url).path)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=get) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(results) == 2 and results[0] == results[1]
        assert results[0].read_bytes() == data
        assert srv.gets("/w.bin") == [None]  # the second caller waited for the first and used its file


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    assert download.cache_root() == tmp_path / "cache"
    monkeypatch.delenv("VITLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert download.cache_root() == tmp_path / "xdg" / "vitlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert download.cache_root() == tmp_path / "home" / ".cache" / "vitlab"


def test_gs_names_map_to_the_public_https_endpoint():
    loc, entry = hub.locate("gs://vit_models/imagenet21k/ViT-B_16.npz")
    key = "vit_models/imagenet21k/ViT-B_16.npz"
    assert (loc.kind, loc.url, entry) == ("url", f"https://storage.googleapis.com/{key}", None)
    assert download.url_cache_path(loc.url, Path("/c")) == Path("/c/storage.googleapis.com") / key
    with pytest.raises(WeightsError, match="gs://bucket/key"):
        hub.locate("gs://bucket-only")


def test_load_model_from_a_url_gives_the_saved_model(tmp_path):
    ours = perturb_(vitlab.create_model("ViT-Ti/16", depth=2, img_size=32, patch_size=8, num_classes=5)).eval()
    vitlab.save_weights(ours, tmp_path / "m.safetensors")
    data = (tmp_path / "m.safetensors").read_bytes()
    with FileServer({"/m.safetensors": data}) as srv:
        loaded = vitlab.load_model(srv.url("/m.safetensors") + f"#sha256={sha(data)[:12]}")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), ours(x), atol=0, rtol=0)
    assert os.path.exists(download.url_cache_path(srv.url("/m.safetensors")))
