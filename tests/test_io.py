"""One atomic writer (`vitlab.utils.io`) behind every file vitlab writes: the usual permissions (0o666 less the umask,
not mkstemp's 0o600), and a failed write leaves the old file intact and no temporary file."""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from vitlab.utils import io as vio

# Each writer of the library, run in a fresh process under the umask given in argv[2]; prints {file: mode}.
WRITERS = textwrap.dedent("""
    import functools, http.server, json, os, shutil, sys, threading
    from pathlib import Path
    os.umask(int(sys.argv[2], 8))
    import torch, vitlab
    from vitlab import bench
    from vitlab.utils import io
    from vitlab.train import checkpoint
    from vitlab.weights import download, npz, publish

    out = Path(sys.argv[1])
    m = vitlab.create_model("ViT-Ti/16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                            patch_size=7, in_chans=1, num_classes=10)
    io.write_atomic(out / "io.bin", b"x")
    vitlab.save_weights(m, out / "w.safetensors")
    vitlab.save_weights(m, out / "w.npz")
    npz.save_npz({"a": torch.zeros(2).numpy()}, out / "arrays.npz")
    checkpoint.save_checkpoint(out / "ckpt", 1, lambda p: vitlab.save_weights(m, p), {"x": torch.ones(1)}, keep=1)
    checkpoint.atomic_write(out / "train-report.json", lambda p: p.write_text("{}"))
    publish.save_pretrained(m, out / "pretrained")
    download._copy_atomic(out / "io.bin", out / "copied.bin")
    machine = {"cpu": "cpu", "torch_threads": 1, "torch": "x", "loadavg_start": None}
    result = {"machine": machine, "matmul_peak_gflops": {}, "results": [],
              "config": {"model": "m", "vit": {"img_size": 28, "depth": 1, "embed_dim": 32}}}
    bench.write_outputs(result, out / "bench", png=False)

    (out / "served").mkdir()
    (out / "served" / "file.bin").write_bytes(b"payload" * 100)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out / "served"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/file.bin"
    download.download_url(url, out / "dl" / "file.bin", progress=False, retries=0)
    server.shutdown()
    shutil.rmtree(out / "served")

    modes = {str(p.relative_to(out)): oct(p.stat().st_mode & 0o777) for p in sorted(out.rglob("*")) if p.is_file()}
    print(json.dumps(modes))
""")


@pytest.mark.parametrize("umask, expected", [("022", 0o644), ("002", 0o664)])
def test_every_writer_gives_the_usual_permissions(tmp_path, umask, expected):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", WRITERS, str(tmp_path), umask], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    modes = json.loads(proc.stdout.strip().splitlines()[-1])
    must = {"io.bin", "w.safetensors", "w.npz", "arrays.npz", "ckpt/step_00000001.safetensors",
            "ckpt/step_00000001.state.pt", "train-report.json", "pretrained/model.safetensors",
            "pretrained/config.json", "pretrained/README.md", "copied.bin", "bench/bench.json", "bench/bench.txt",
            "dl/file.bin"}
    assert must <= set(modes), sorted(must - set(modes))
    assert {name: mode for name, mode in modes.items() if mode != oct(expected)} == {}
    assert not [n for n in modes if "/.tmp-" in f"/{n}"]  # no temporary file left


def test_default_mode_follows_the_umask_without_changing_it():
    old = os.umask(0o027)
    try:
        assert vio.default_mode() == 0o640
        assert os.umask(0o027) == 0o027  # still what we set
    finally:
        os.umask(old)


@pytest.mark.parametrize("kind", ["context", "callback"])
def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, kind):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"old")

    def half_then_fail(tmp):
        assert tmp.parent == path.parent and tmp.name.endswith(path.name) and not tmp.exists()
        tmp.write_bytes(b"half a fi")
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        if kind == "context":
            with vio.atomic_write(path, overwrite=True) as tmp:
                half_then_fail(tmp)
        else:
            vio.write_atomic(path, half_then_fail, overwrite=True)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_overwrite_rules(tmp_path):
    path = tmp_path / "sub" / "a.json"
    vio.write_atomic(path, "1")  # creates the folder
    with pytest.raises(FileExistsError, match="overwrite=True"):
        vio.write_atomic(path, "2")
    assert path.read_text() == "1"
    vio.write_atomic(path, "2", overwrite=True)
    assert path.read_text() == "2"
    with pytest.raises(IsADirectoryError):
        vio.write_atomic(tmp_path / "sub", b"")

    # a file that appears while we write is not replaced without overwrite=True, and the temporary goes
    late = tmp_path / "late.txt"
    with pytest.raises(FileExistsError), vio.atomic_write(late) as tmp:
        tmp.write_text("ours")
        late.write_text("theirs")
    assert late.read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["late.txt", "sub"]


def test_explicit_mode_and_place(tmp_path):
    path = vio.write_atomic(tmp_path / "secret.key", b"k", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    src = tmp_path / "done.part"
    src.write_bytes(b"data")
    os.chmod(src, 0o640)
    dest = vio.place(src, tmp_path / "done")
    assert dest.read_bytes() == b"data" and not src.exists()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640  # place keeps the mode unless told
