"""Load test of `vitlab serve` (issue 34 item 5): throughput, p50/p95/p99 latency and error rate at several
concurrencies, the hand-written FastAPI + timm handler (and LitServe) beside it in the same run, and a soak at
overload that watches resident memory.

The client is a closed-loop asyncio client in this process: N users, each on its own keep-alive connection, each
sending one JPEG (640x480, multipart upload, as `curl -F` does) and waiting for the answer before the next. A 503
is counted as shed load, and its user waits what Retry-After says, as a polite client does; any other non-200, and
any broken connection, is an error (a kept-alive connection that the server closed while its user waited is
reopened once first, as HTTP clients do: uvicorn closes idle connections after 5 s, and Retry-After can be
longer). Each level runs `--warmup` seconds unmeasured, then `--duration` seconds measured (throughput = answers
completed in that window / its length; latencies of those answers); then the users finish what they sent, so the
next level starts on an idle server. Resident memory is the sum over the server's
process tree (/proc), sampled every 5 s.

Every server is started by this script, on the same random-weight checkpoint (vitlab.save_weights; timm loads it
with strict=True), with timm's preprocessing for that architecture on both sides (crop 0.9, bicubic, mean/std 0.5).

    .venv/bin/python benchmarks/serve_load.py --models ViT-S/16 ViT-B/16 --concurrency 1 8 32 128 \
        --compare fastapi vitlab-fp32 litserve --soak 600 -o benchmarks/results/serve
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
TIMM_ARCH = {"ViT-S/16": "vit_small_patch16_224", "ViT-B/16": "vit_base_patch16_224", "ViT-Ti/16":
             "vit_tiny_patch16_224"}
BOUNDARY = "loadtestboundary7f3a"


# -- inputs --------------------------------------------------------------------------------------------------------


def make_checkpoint(name: str, folder: Path) -> Path:
    """A random-init model of `name` with a non-zero head and timm's preprocessing for it, as vitlab writes it."""
    import torch

    import vitlab
    from vitlab.models.preprocess import Preprocess

    path = folder / (name.replace("/", "").lower() + ".safetensors")
    if path.exists():
        return path
    torch.manual_seed(0)
    model = vitlab.create_model(name)
    with torch.no_grad():
        model.head.weight.normal_(0, 0.02)
    model.preprocess = Preprocess(img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, resize="center_crop",
                                  crop_fraction=0.9, interpolation="bicubic", source="timm vit_*_patch16_224")
    vitlab.save_weights(model, path)
    return path


def make_images(n: int = 8, seed: int = 0) -> list[bytes]:
    """Photo-like JPEGs, 640x480: smooth gradients plus noise (about 40-60 KB each)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        y, x = np.mgrid[0:480, 0:640].astype(np.float32)
        k = i + 8 * seed
        base = np.stack([np.sin(x / (40 + 7 * k)) * 80, np.cos(y / (30 + 5 * k)) * 80, (x + y) / 9], axis=-1)
        pixels = np.clip(base + 128 + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
        out.append(buf.getvalue())
    return out


def request_bytes(image: bytes, host: str, port: int) -> bytes:
    body = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="photo.jpg"\r\n'
            "Content-Type: image/jpeg\r\n\r\n").encode() + image + f"\r\n--{BOUNDARY}--\r\n".encode()
    head = (f"POST /predict HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; "
            f"boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


# -- servers -------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """One server process of one engine."""

    def __init__(self, engine: str, checkpoint: Path, model: str, mode: str, args: argparse.Namespace):
        self.engine, self.port = engine, free_port()
        py = sys.executable
        if engine.startswith("vitlab"):
            m = "fp32" if engine == "vitlab-fp32" else mode
            cmd = [py, "-m", "vitlab.cli", "serve", str(checkpoint), "--mode", m, "--port", str(self.port),
                   "--max-batch-size", str(args.max_batch_size), "--batch-timeout", str(args.batch_timeout),
                   "--max-queue", str(args.max_queue), "--workers", str(args.workers), "--calib", str(args.calib)]
            self.mode = m
        elif engine == "fastapi":
            cmd = [py, str(HERE / "serve_baseline_fastapi.py"), "--weights", str(checkpoint), "--arch",
                   TIMM_ARCH[model], "--port", str(self.port)]
            self.mode = "fp32"
        elif engine == "litserve":
            cmd = [py, str(HERE / "serve_baseline_litserve.py"), "--weights", str(checkpoint), "--mode", mode,
                   "--port", str(self.port), "--max-batch-size", str(args.max_batch_size), "--batch-timeout",
                   str(args.batch_timeout), "--calib", str(args.calib)]
            self.mode = mode
        else:
            raise ValueError(f"unknown engine {engine!r}")
        self.log = open(args.output / f"server-{engine}-{model.replace('/', '')}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.time()
        deadline = time.time() + args.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{engine} exited with {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                                                      timeout=5) as r:
                if r.status == 200:
                    break
            if time.time() > deadline:
                raise RuntimeError(f"{engine} not ready after {args.start_timeout} s")
            time.sleep(0.5)
        self.ready_s = time.time() - self.started

    def rss_mb(self) -> float:
        """Resident memory of the server and every process below it (pages shared by a forked worker and its
        forkserver are counted in each)."""
        return _sum_field(_tree(self.proc.pid), "status", "VmRSS:")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server's processes have used so far."""
        total = 0
        for pid in _tree(self.proc.pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return total / os.sysconf("SC_CLK_TCK")

    def pss_mb(self) -> float:
        """Proportional set size of the same processes: shared pages split among their sharers."""
        return _sum_field(_tree(self.proc.pid), "smaps_rollup", "Pss:")


    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # LitServe's workers, if any outlived it
        self.log.close()


def _sum_field(pids: list[int], file: str, field: str) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1])
    return round(total / 1024, 1)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


# -- the client ----------------------------------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.read()
    return status, headers, body


async def _user(uid: int, port: int, requests: list[bytes], t_measure: float, t_stop: float,
                records: list[tuple[float, float, int]]) -> None:
    """One closed-loop user until t_stop; records (start, latency, status) of answers completed in the window."""
    loop = asyncio.get_running_loop()
    reader = writer = None
    i = uid
    while loop.time() < t_stop:
        try:
            t0 = loop.time()
            for attempt in (0, 1):  # a kept-alive connection the server closed while idle: once more on a new one
                fresh = writer is None
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert reader is not None and writer is not None
                try:
                    writer.write(requests[i % len(requests)])
                    await writer.drain()
                    status, headers, _ = await _read_response(reader)
                    break
                except (OSError, asyncio.IncompleteReadError):
                    writer.close()
                    writer = None
                    if fresh or attempt:
                        raise
            i += 1
            t1 = loop.time()
            if t_measure <= t1 <= t_stop:
                records.append((t0, t1 - t0, status))
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
            if status == 503:
                await asyncio.sleep(min(float(headers.get("retry-after", "1")), max(0.0, t_stop - loop.time())))
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            t1 = loop.time()
            if t_measure <= t1 <= t_stop:
                records.append((t1, 0.0, -1))  # a broken connection: an error
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.1)
    if writer is not None:
        writer.close()


async def _load(port: int, images: list[bytes], concurrency: int, warmup: float, duration: float,
                sample=None, cpu=None) -> dict:
    loop = asyncio.get_running_loop()
    requests = [request_bytes(im, "127.0.0.1", port) for im in images]
    start = loop.time()
    t_measure, t_stop = start + warmup, start + warmup + duration
    records: list[tuple[float, float, int]] = []
    users = [asyncio.create_task(_user(u, port, requests, t_measure, t_stop, records)) for u in range(concurrency)]
    rss = []
    await asyncio.sleep(warmup)
    cpu0 = cpu() if cpu is not None else 0.0
    while loop.time() < t_stop:
        await asyncio.sleep(min(5.0, max(0.0, t_stop - loop.time())))
        if sample is not None:
            rss.append((round(loop.time() - start, 1), *sample()))
    cpu_used = cpu() - cpu0 if cpu is not None else None
    await asyncio.wait(users, timeout=600)
    for u in users:
        u.cancel()
    out = summarize(records, duration) | ({"rss_mb": rss} if rss else {})
    if cpu_used:
        out |= {"server_cpu_s": round(cpu_used, 1), "cores_used": round(cpu_used / duration, 2),
                "per_cpu_s": round(out["answered"] / cpu_used, 2)}
    return out


def summarize(records: list[tuple[float, float, int]], duration: float) -> dict:
    ok = np.array([lat for _, lat, s in records if s == 200])
    statuses: dict[str, int] = {}
    for _, _, s in records:
        statuses[str(s)] = statuses.get(str(s), 0) + 1
    total = len(records)
    errors = sum(n for s, n in statuses.items() if s not in ("200", "503"))
    pct = (lambda q: round(float(np.percentile(ok, q)) * 1000, 1)) if len(ok) else (lambda q: None)
    return {"answered": len(ok), "throughput": round(len(ok) / duration, 2), "p50_ms": pct(50),
            "p95_ms": pct(95), "p99_ms": pct(99), "shed_503": statuses.get("503", 0), "errors": errors,
            "error_rate": round(errors / total, 4) if total else 0.0, "statuses": statuses}


# -- the run -------------------------------------------------------------------------------------------------------


def host_class() -> str:
    """The machine, as every vitlab result names it (`vitlab.perf.cpu.machine_summary`)."""
    from vitlab.perf.cpu import machine_summary

    return machine_summary()["summary"]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(args: argparse.Namespace) -> dict:
    args.output.mkdir(parents=True, exist_ok=True)
    work = args.work  # checkpoints (ViT-B/16: 350 MB) and calibration images: not results
    work.mkdir(parents=True, exist_ok=True)
    images = make_images()
    args.calib = work / "calib"  # the int8 modes calibrate on the same kind of photo (the weights are random)
    args.calib.mkdir(exist_ok=True)
    for i, image in enumerate(make_images(16, seed=1)):
        (args.calib / f"{i:02d}.jpg").write_bytes(image)
    result: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "host": host_class(),
                    "load_before": load_average(), "levels": [], "compare": [], "soak": None}
    print(f"host: {result['host']}; load {result['load_before']}", flush=True)

    def level(served: Served, model: str, c: int, duration: float) -> dict:
        load = load_average()
        r = asyncio.run(_load(served.port, images, c, args.warmup, duration, cpu=served.cpu_seconds))
        row = {"engine": served.engine, "model": model, "mode": served.mode, "concurrency": c,
               "load_before": load, "rss_mb": served.rss_mb(), "pss_mb": served.pss_mb(), **r}
        print(json.dumps(row), flush=True)
        return row

    for model in args.models:
        ckpt = make_checkpoint(model, work)
        served = Served("vitlab", ckpt, model, args.mode, args)
        try:
            for c in args.concurrency:
                result["levels"].append(level(served, model, c, args.duration))
            if args.compare_concurrency not in args.concurrency and args.compare:
                result["compare"].append(level(served, model, args.compare_concurrency, args.duration))
            else:
                result["compare"] += [r for r in result["levels"]
                                      if r["model"] == model and r["concurrency"] == args.compare_concurrency]
        finally:
            served.stop()
        for engine in args.compare:
            if model not in args.compare_models:
                continue
            try:
                other = Served(engine, ckpt, model, args.mode, args)
            except Exception as e:  # LitServe not installed, ...
                print(f"{engine}: skipped ({e})", flush=True)
                result["compare"].append({"engine": engine, "model": model, "skipped": str(e)})
                continue
            try:
                result["compare"].append(level(other, model, args.compare_concurrency, args.duration))
            finally:
                other.stop()
    if args.soak:
        model = args.models[0]
        served = Served("vitlab", make_checkpoint(model, work), model, args.mode, args)
        try:
            load = load_average()
            r = asyncio.run(_load(served.port, images, args.soak_concurrency, args.warmup, args.soak,
                                  sample=lambda: (served.rss_mb(), served.pss_mb()), cpu=served.cpu_seconds))
            rss = r["rss_mb"]  # (seconds, RSS, PSS) every 5 s
            warm = next((s for s in rss if s[0] >= args.warmup + 60), rss[0])
            r |= {"engine": "vitlab", "model": model, "mode": served.mode, "concurrency": args.soak_concurrency,
                  "seconds": args.soak, "load_before": load, "load_after": load_average(),
                  "rss_after_warmup_mb": warm[1], "rss_end_mb": rss[-1][1], "rss_max_mb": max(s[1] for s in rss),
                  "rss_growth": round((rss[-1][1] - warm[1]) / warm[1], 4),
                  "pss_after_warmup_mb": warm[2], "pss_end_mb": rss[-1][2],
                  "pss_growth": round((rss[-1][2] - warm[2]) / warm[2], 4)}
            result["soak"] = r
            print(json.dumps({k: v for k, v in r.items() if k != "rss_mb"}), flush=True)
        finally:
            served.stop()
    result["load_after"] = load_average()
    (args.output / "serve_load.json").write_text(json.dumps(result, indent=1))
    (args.output / "serve_load.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(r: dict) -> str:
    lines = [f"`{r['command']}`", "", f"{r['date']}; host: {r['host']}; load average {r['load_before']} before, "
             f"{r.get('load_after', '?')} after", "",
             "| engine | model | mode | concurrency | req/s | p50 ms | p95 ms | p99 ms | 503 | errors | error rate | "
             "server cores used | req per CPU-s | RSS MB | PSS MB | load before |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in r["levels"] + [c for c in r["compare"] if c not in r["levels"] and "skipped" not in c]:
        lines.append(f"| {row['engine']} | {row['model']} | {row['mode']} | {row['concurrency']} | "
                     f"{row['throughput']} | {row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['shed_503']} | "
                     f"{row['errors']} | {row['error_rate']:.2%} | {row.get('cores_used')} | {row.get('per_cpu_s')} | "
                     f"{row['rss_mb']} | {row['pss_mb']} | {row['load_before']} |")
    base = {(c["model"]): c for c in r["compare"] if c.get("engine") == "fastapi" and "throughput" in c}
    for c in r["compare"]:
        b = base.get(c["model"])
        if b and "throughput" in c and c["engine"] != "fastapi" and b["throughput"]:
            per_cpu = (f", per CPU-second of the server {c['per_cpu_s'] / b['per_cpu_s']:.2f}x"
                       if c.get("per_cpu_s") and b.get("per_cpu_s") else "")
            lines.append(f"\n{c['engine']} ({c['mode']}) / fastapi+timm at concurrency {c['concurrency']}, "
                         f"{c['model']}: **{c['throughput'] / b['throughput']:.2f}x** requests/s{per_cpu}")
    s = r.get("soak")
    if s:
        lines.append(f"\nSoak: {s['model']} {s['mode']}, concurrency {s['concurrency']}, {s['seconds']} s: "
                     f"{s['answered']} answered ({s['throughput']} req/s), {s['shed_503']} shed with 503, "
                     f"{s['errors']} other errors; p50/p95/p99 {s['p50_ms']}/{s['p95_ms']}/{s['p99_ms']} ms; RSS "
                     f"{s['rss_after_warmup_mb']} MB after warm-up -> {s['rss_end_mb']} MB at the end (max "
                     f"{s['rss_max_mb']}): growth {s['rss_growth']:.2%} (PSS {s['pss_after_warmup_mb']} -> "
                     f"{s['pss_end_mb']} MB: {s['pss_growth']:.2%}); load {s['load_before']} -> {s['load_after']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["ViT-S/16", "ViT-B/16"], choices=sorted(TIMM_ARCH))
    p.add_argument("--concurrency", nargs="*", type=int, default=[1, 8, 32, 128])
    p.add_argument("--mode", default="openvino-int8", help="vitlab serve --mode (and LitServe's)")
    p.add_argument("--compare", nargs="*", default=["fastapi"], choices=["fastapi", "litserve", "vitlab-fp32"])
    p.add_argument("--compare-models", nargs="*", default=None, help="models the comparison runs for (default all)")
    p.add_argument("--compare-concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before each level")
    p.add_argument("--soak", type=float, default=0.0, help="seconds of the overload soak (0: none)")
    p.add_argument("--soak-concurrency", type=int, default=128)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--batch-timeout", type=float, default=0.01)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("-o", "--output", type=Path, default=Path("benchmarks/results/serve"))
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vitlab-serve-load",
                   help="where the random checkpoints and calibration images are written")
    args = p.parse_args()
    if args.compare_models is None:
        args.compare_models = args.models
    run(args)


if __name__ == "__main__":
    main()
