"""`vitlab serve` against real server processes on free ports: the API, every bad input of issue 34 item 4, the
batch form, 500 bad requests among 500 good ones, the API key, metrics, a real SIGTERM drain, a killed worker
restarted, a checkpoint that cannot load, and the page in headless chromium.

Two `vitlab serve` processes start at once when the module starts (a tiny ViT on 32 px for the API, a slower ViT on
224 px with two workers and an API key for the drain), so the module pays one start-up."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.models.preprocess import Preprocess

pytest.importorskip("fastapi", reason="vitlab[serve] not installed")
pytest.importorskip("uvicorn", reason="vitlab[serve] not installed")

CLASSES = [f"class-{i}" for i in range(10)]
READY = re.compile(r"on http://([\d.]+):(\d+)")
KEY = "s3cret-key"


# -- servers ---------------------------------------------------------------------------------------------------


class Server:
    """One `vitlab serve` process; `url` once its ready line appeared."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "vitlab.cli", "serve", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.host: str | None = None
        self.port: int | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = READY.search(line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                self._ready.set()
        self._ready.set()  # the process ended

    def wait_ready(self, timeout: float = 120) -> Server:
        assert self._ready.wait(timeout), "server did not start:\n" + "".join(self.lines)
        assert self.port is not None, "server exited:\n" + "".join(self.lines)
        return self

    def conn(self, timeout: float = 60) -> http.client.HTTPConnection:
        assert self.host is not None and self.port is not None
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                ) -> tuple[int, dict, bytes]:
        c = self.conn()
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def json(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             ) -> tuple[int, dict, dict]:
        status, h, data = self.request(method, path, body, headers)
        return status, h, json.loads(data)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def _model(tmp: Path, name: str, img_size: int, depth: int, embed_dim: int = 192) -> Path:
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", img_size=img_size, depth=depth, num_classes=10, embed_dim=embed_dim)
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)  # a head that is not zero: the classes differ per image
    model.preprocess = Preprocess(img_size=img_size, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                                  resize="center_crop", crop_fraction=0.875, source="test")
    path = tmp / name
    vitlab.save_weights(model, path, {"classes": CLASSES})
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    tiny = _model(tmp, "tiny.safetensors", 32, 2)
    slow = _model(tmp, "slow.safetensors", 224, 4)
    common = ["--port", "0", "--threads", "1", "--batch-timeout", "0.02"]
    api = Server(str(tiny), *common, "--max-batch-size", "8")
    drain = Server(str(slow), *common, "--max-batch-size", "4", "--api-key", KEY, "--drain-timeout", "60",
                   "--workers", "2")
    try:
        yield {"api": api.wait_ready(), "drain": drain.wait_ready(), "tmp": tmp, "tiny": tiny}
    finally:
        for s in (api, drain):
            s.stop()


# -- images ------------------------------------------------------------------------------------------------------


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _picture(w: int = 48, h: int = 40, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _bomb_png(side: int = 60000) -> bytes:
    """A PNG that declares side x side 1-bit pixels in a few hundred bytes (its data stops early)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 200_000)) + \
        chunk(b"IEND", b"")


def _multipart(files: list[tuple[str, bytes, str]], boundary: str = "vitlabBoundary42") -> tuple[bytes, dict]:
    parts = []
    for name, data, ctype in files:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                     f"Content-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def _reference(model_path: Path, images: dict[str, bytes], tmp: Path) -> dict[str, list]:
    """What `vitlab.predict` (the library, one image at a time) says of each image: the answers to match."""
    out = {}
    for name, data in images.items():
        f = tmp / name
        f.write_bytes(data)
        (r,) = vitlab.predict(model_path, [f], top_k=3)
        out[name] = [(t["label"], t["prob"]) for t in r["top"]]
    return out


def _same(answer: list[dict], expected: list) -> bool:
    return [t["label"] for t in answer] == [e[0] for e in expected] and all(
        abs(t["prob"] - e[1]) < 1e-4 for t, e in zip(answer, expected))


def _assert_clean_error(status: int, body: bytes, tmp: Path, expect: int, kind: str | None = None) -> None:
    """A JSON error of the expected status and kind, with no path, traceback or Python internals in it."""
    text = body.decode("utf-8", "replace")
    assert status == expect, (status, text)
    err = json.loads(text)["error"]
    assert kind is None or err["kind"] == kind, err
    for leak in (str(tmp), "Traceback", "File \"", "site-packages", "0x7f", "<_io."):
        assert leak not in text, (leak, text)


# -- the API ------------------------------------------------------------------------------------------------------


def test_health_info_openapi_metrics(servers):
    api: Server = servers["api"]
    status, _, health = api.json("GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["workers"][0]["state"] == "ready"
    status, _, info = api.json("GET", "/info")
    assert status == 200 and info["model"] == "tiny.safetensors" and info["num_classes"] == 10
    assert info["input"] == [3, 32, 32] and info["mode"] == "fp32" and str(servers["tmp"]) not in json.dumps(info)
    status, _, spec = api.json("GET", "/openapi.json")
    assert status == 200 and {"/predict", "/explain", "/health", "/metrics", "/info"} <= set(spec["paths"])
    assert "multipart/form-data" in spec["paths"]["/predict"]["post"]["requestBody"]["content"]
    status, _, docs = api.request("GET", "/docs")
    assert status == 200 and b"openapi.json" in docs and b"http" not in docs.split(b"<body>")[1].split(b"openapi")[0]
    status, headers, text = api.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("vitlab_serve_requests_total", "vitlab_serve_errors_total", "vitlab_serve_batch_size_bucket",
                 "vitlab_serve_queue_depth", "vitlab_serve_request_latency_seconds_bucket",
                 "vitlab_serve_workers_ready 1.0"):
        assert name.encode() in text, name


def test_every_format_exif_and_gif_first_frame(servers):
    """JPEG, PNG, WebP, BMP, TIFF and GIF give what the library gives for the same file; EXIF orientation is
    applied (a rotated PNG with its orientation tag answers as the upright one); a GIF answers its first frame."""
    api: Server = servers["api"]
    pic = _picture(48, 40)
    upright = _picture(40, 56, seed=3)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view": the stored pixels are the upright image turned the other way
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    frame1, frame2 = _picture(48, 48, seed=5).quantize(64), _picture(48, 48, seed=6).quantize(64)
    gif = io.BytesIO()
    frame1.save(gif, format="GIF", save_all=True, append_images=[frame2])
    first_frame = _encode(Image.open(io.BytesIO(gif.getvalue())).convert("RGB"), "PNG")
    images = {"a.jpg": _encode(pic, "JPEG", quality=90), "a.png": _encode(pic, "PNG"),
              "a.webp": _encode(pic, "WEBP", lossless=True), "a.bmp": _encode(pic, "BMP"),
              "a.tiff": _encode(pic, "TIFF"), "a.gif": gif.getvalue(), "first.png": first_frame,
              "exif.png": _encode(stored, "PNG", exif=exif.tobytes()), "upright.png": _encode(upright, "PNG")}
    expected = _reference(servers["tiny"], images, servers["tmp"])
    for name, data in images.items():
        status, _, answer = api.json("POST", "/predict?top_k=3", data, {"Content-Type": "application/octet-stream"})
        assert status == 200, (name, answer)
        assert _same(answer["predictions"][0]["top"], expected[name]), (name, answer, expected[name])
    assert expected["a.gif"] == expected["first.png"]
    assert expected["exif.png"] == expected["upright.png"]


def test_batch_form_answers_each_image_in_order(servers):
    api: Server = servers["api"]
    images = {f"img{i}.png": _encode(_picture(40 + i, 36, seed=10 + i), "PNG") for i in range(3)}
    expected = _reference(servers["tiny"], images, servers["tmp"])
    body, headers = _multipart([(n, d, "image/png") for n, d in images.items()])
    status, _, answer = api.json("POST", "/predict?top_k=3", body, headers)
    assert status == 200 and [p["filename"] for p in answer["predictions"]] == list(images)
    for p, name in zip(answer["predictions"], images):
        assert _same(p["top"], expected[name])


def test_bad_inputs_get_4xx_json_and_the_server_keeps_serving(servers):
    api: Server = servers["api"]
    tmp = servers["tmp"]
    jpeg = _encode(_picture(64, 64), "JPEG", quality=90)
    octet = {"Content-Type": "application/octet-stream"}
    cases = [
        ("empty body", b"", octet, 400, "empty_body"),
        ("not an image", b"hello, this is text" * 10, octet, 400, "not_an_image"),
        ("truncated JPEG", jpeg[: len(jpeg) * 3 // 4], {"Content-Type": "image/jpeg"}, 400, "corrupt_image"),
        ("wrong content type", jpeg, {"Content-Type": "application/json"}, 415, "unsupported_media_type"),
        ("form-urlencoded", jpeg, {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
        ("bomb", _bomb_png(), {"Content-Type": "image/png"}, 400, "too_many_pixels"),
        ("malformed multipart", b"--nope\r\ngarbage", {"Content-Type": "multipart/form-data; boundary=XYZ"}, 400,
         None),
        ("multipart without boundary", b"--XYZ\r\n", {"Content-Type": "multipart/form-data"}, 400, "bad_multipart"),
        ("bad top_k", jpeg, {"Content-Type": "image/jpeg"}, 400, "bad_parameter"),
    ]
    assert len(_bomb_png()) < 4096
    for what, body, headers, code, kind in cases:
        path = "/predict?top_k=0" if what == "bad top_k" else "/predict"
        started = time.perf_counter()
        status, _, text = api.request("POST", path, body, headers)
        _assert_clean_error(status, text, tmp, code, kind)
        if what == "bomb":  # refused from the header: no 3.6-gigapixel decode
            assert time.perf_counter() - started < 5
    for size in ((1, 1), (10000, 40)):  # valid, if odd: answered
        status, _, answer = api.json("POST", "/predict", _encode(_picture(*size), "PNG"), {"Content-Type": "image/png"})
        assert status == 200 and len(answer["predictions"][0]["top"]) == 5, (size, answer)
    status, _, text = api.request("GET", "/no/such/endpoint")
    _assert_clean_error(status, text, tmp, 404, "not_found")
    status, _, health = api.json("GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["workers"][0]["restarts"] == 0


def _raw_exchange(server: Server, head: bytes, body_chunks, timeout: float = 30) -> tuple[int, bytes]:
    """Send `head` and then the chunks from a thread (the server may stop reading), read the status line."""
    sock = socket.create_connection((server.host, server.port), timeout=timeout)

    def send() -> None:
        try:
            sock.sendall(head)
            for c in body_chunks:
                sock.sendall(c)
        except OSError:
            pass  # the server answered 413 and closed: expected

    t = threading.Thread(target=send, daemon=True)
    t.start()
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                break
            data += got
        length = re.search(rb"content-length: (\d+)", data.split(b"\r\n\r\n", 1)[0].lower())
        while length and len(data.split(b"\r\n\r\n", 1)[1]) < int(length.group(1)):  # the rest of the body
            got = sock.recv(65536)
            if not got:
                break
            data += got
    except OSError:
        pass
    finally:
        sock.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1") else 0
    return status, data.split(b"\r\n\r\n", 1)[-1]


def test_body_over_the_limit_is_413_before_it_is_read(servers):
    api: Server = servers["api"]
    size = 21_000_000  # the default limit is 20 MB
    head = (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: {size}\r\n\r\n"
            ).encode()
    status, body = _raw_exchange(api, head, [b"\0" * 65536])  # declared: refused after 64 KB of it
    _assert_clean_error(status, body, servers["tmp"], 413, "body_too_large")
    chunk = b"\0" * 1_000_000
    chunked = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nTransfer-Encoding: chunked\r\n\r\n")
    frames = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(21)] + [b"0\r\n\r\n"]
    status, body = _raw_exchange(api, chunked, frames)  # not declared: counted while it streams
    _assert_clean_error(status, body, servers["tmp"], 413, "body_too_large")
    assert api.json("GET", "/health")[2]["status"] == "ok"


def test_500_bad_requests_among_500_good_ones(servers):
    """Concurrent good and bad requests share the server's batches; every good one gets its own right answer."""
    api: Server = servers["api"]
    goods = {f"g{i}.png": _encode(_picture(30 + i, 34, seed=100 + i), "PNG") for i in range(5)}
    expected = _reference(servers["tiny"], goods, servers["tmp"])
    jpeg = _encode(_picture(64, 64), "JPEG")
    bads = [(b"", "application/octet-stream"), (b"not an image at all", "image/png"),
            (jpeg[: len(jpeg) // 2], "image/jpeg"), (jpeg, "text/plain"), (_bomb_png(), "image/png")]
    jobs = [("good", name) for name in goods for _ in range(100)] + [("bad", i) for i in range(len(bads))
                                                                     for _ in range(100)]
    rng = np.random.default_rng(0)
    jobs = [jobs[i] for i in rng.permutation(len(jobs))]

    def run(job):
        kind, key = job
        c = api.conn()
        try:
            if kind == "good":
                c.request("POST", "/predict?top_k=3", goods[key], {"Content-Type": "image/png"})
            else:
                data, ctype = bads[key]
                c.request("POST", "/predict", data, {"Content-Type": ctype})
            r = c.getresponse()
            return kind, key, r.status, r.read()
        finally:
            c.close()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    assert len(results) == 1000
    for kind, key, status, body in results:
        if kind == "good":
            assert status == 200, body
            assert _same(json.loads(body)["predictions"][0]["top"], expected[key]), (key, body)
        else:
            assert 400 <= status < 500, (key, status, body)
    _, _, metrics = api.request("GET", "/metrics")
    sizes = {m.group(1): float(m.group(2)) for m in
             re.finditer(rb'vitlab_serve_batch_size_bucket\{le="([\d.]+)"\} ([\d.]+)', metrics)}
    count = float(re.search(rb"vitlab_serve_batch_size_count ([\d.]+)", metrics).group(1))
    assert sizes[b"1.0"] < count, "no batch held more than one image: nothing was batched"


def test_page_in_headless_chromium(servers, tmp_path):
    from tests.browser import Browser, require_browser

    require_browser()
    api: Server = servers["api"]
    image = tmp_path / "upload.png"
    _picture(64, 48, seed=7).save(image)
    b = Browser()
    try:
        d = b.driver
        d.get_log("browser")
        d.get(f"http://{api.host}:{api.port}/")
        d.execute_script("document.getElementById('file').hidden = false;")
        d.find_element("id", "file").send_keys(str(image))
        deadline = time.time() + 30
        while d.execute_script("return document.body.dataset.state") != "done":
            assert time.time() < deadline, d.find_element("id", "error").text or "no result shown"
            time.sleep(0.1)
        text = d.find_element("tag name", "body").text
        rows = [r.text for r in d.find_elements("css selector", "#bars .row")]
        errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
        painted = d.execute_script(
            "const c = document.getElementById('rollout').getContext('2d').getImageData(0, 0, 224, 224).data;"
            "let s = 0; for (let i = 0; i < c.length; i += 4) s += c[i] + c[i + 1] + c[i + 2]; return s;")
    finally:
        b.close()
    assert not errors, errors
    assert len(rows) == 5 and all(r.split("\n")[0] in CLASSES for r in rows)
    assert "tiny.safetensors" in text and "mode fp32" in text and "ms in the server" in text
    assert "2×2 patches" in text and painted > 0


# -- the API key and SIGTERM ----------------------------------------------------------------------------------------


def test_api_key(servers):
    s: Server = servers["drain"]
    png = _encode(_picture(), "PNG")
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
        status, _, text = s.request("POST", "/predict", png, {"Content-Type": "image/png", **headers})
        _assert_clean_error(status, text, servers["tmp"], 401, "unauthorized")
    assert s.request("GET", "/metrics")[0] == 401
    assert s.request("POST", "/predict", png, {"Content-Type": "image/png", "X-API-Key": KEY})[0] == 200
    assert s.request("POST", "/predict", png, {"Content-Type": "image/png", "Authorization": f"Bearer {KEY}"})[0] == 200
    assert s.request("GET", "/health")[0] == 200 and s.request("GET", "/")[0] == 200  # probes and the page: open


def test_sigterm_drains_requests_in_flight(servers):
    """A real SIGTERM while requests are queued and running: every one is answered 200, the process exits 0,
    and nothing listens afterwards."""
    s: Server = servers["drain"]
    assert [w["state"] for w in s.json("GET", "/health")[2]["workers"]] == ["ready", "ready"]
    images = [_encode(_picture(64, 64, seed=i), "PNG") for i in range(24)]
    headers = {"Content-Type": "image/png", "X-API-Key": KEY}
    results: list[int] = []

    def post(data: bytes) -> None:
        results.append(s.request("POST", "/predict", data, headers)[0])

    threads = [threading.Thread(target=post, args=(d,)) for d in images]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while s.json("GET", "/health")[2]["in_flight"] < 8:  # queued and running
        assert time.time() < deadline
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert s.proc.wait(60) == 0, "".join(s.lines)
    assert results == [200] * len(images), results
    with pytest.raises(OSError):
        socket.create_connection((s.host, s.port), timeout=2).close()
    assert not any("Traceback" in line for line in s.lines), "".join(s.lines)


# -- faults ---------------------------------------------------------------------------------------------------------


def test_checkpoint_that_cannot_load_exits_1_with_one_line(tmp_path):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a checkpoint" * 10)
    bad = Server(str(broken), "--port", "0")
    try:
        assert bad.proc.wait(120) == 1
    finally:
        bad.stop()
    lines = [line for line in bad.lines if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("vitlab serve: error: "), lines
    assert bad.port is None  # never announced, never listened


def test_killed_worker_is_restarted_and_health_says_so(servers):
    """SIGKILL the only worker: /health answers 503 "unavailable" with the worker "restarting" meanwhile, a
    request sent then is answered once the new worker is up, and the server is "ok" again with restarts 1."""
    api: Server = servers["api"]
    _, _, health = api.json("GET", "/health")
    pid = health["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    seen, deadline = set(), time.time() + 60
    answer: list[int] = []
    sender = None
    png = _encode(_picture(), "PNG")
    while True:
        status, _, health = api.json("GET", "/health")
        seen.add((status, health["status"], health["workers"][0]["state"]))
        if status == 503 and sender is None:
            sender = threading.Thread(target=lambda: answer.append(
                api.request("POST", "/predict", png, {"Content-Type": "image/png"})[0]))
            sender.start()
        if status == 200 and health["workers"][0]["restarts"] == 1:
            break
        assert time.time() < deadline, seen
        time.sleep(0.02)
    assert any(s == 503 and st == "unavailable" and w in ("restarting", "starting") for s, st, w in seen), seen
    assert health["workers"][0]["pid"] not in (None, pid)
    assert sender is not None
    sender.join(60)
    assert answer == [200]
    png = _encode(_picture(seed=9), "PNG")
    assert api.request("POST", "/predict", png, {"Content-Type": "image/png"})[0] == 200


def test_modes_are_vitlab_optimize_modes():
    from vitlab.deploy.modes import MODES
    from vitlab.serving.config import MODES as SERVE_MODES

    assert SERVE_MODES == MODES
