"""Names to checkpoints: Hub repos read from a cache laid out as huggingface_hub lays it out (HF_HUB_OFFLINE=1),
against transformers' and timm's own models; registry entries (a stand-in table); paths vs repo ids; the
`vitlab weights` command; `create_model(weights=...)` and a recipe's `init.checkpoint`."""

import hashlib
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.models.preprocess import IMAGENET, Preprocess
from vitlab.weights import WeightsError, download, hub, read_config, read_metadata
from vitlab.weights import registry as shipped_registry

from .conftest import perturb_
from .test_weights_download import FileServer, LocalServer, install_registry, sha

ATOL = 1e-4
OWNER_REPO = "acme/tiny-vit"
TIMM_REPO = "timm/vit_tiny_patch16_224.test_in1k"


def put_in_hub_cache(cache: Path, repo_id: str, folder: Path, revision: str = "main") -> Path:
    """Lay `folder`'s files out as huggingface_hub does: blobs named by their hash, snapshots/<commit>/<file>
    symlinked to them, refs/<revision> holding the commit. Returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def hf_model():
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    cfg = HFConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                   patch_size=8, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"})
    return perturb_(ViTForImageClassification(cfg)).eval()


def hf_logits(model, x):
    with torch.no_grad():
        return model(pixel_values=x).logits


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    for var in ("VITLAB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "vitlab"))
    monkeypatch.setattr(download, "BACKOFF", 0.0)
    monkeypatch.chdir(tmp_path)  # so that no "owner/repo" folder exists where the name is looked up
    install_registry(monkeypatch)


def go_online(monkeypatch):
    """Undo the fixture's HF_HUB_OFFLINE=1, also in huggingface_hub, which read it when first imported."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hf_repo(tmp_path):
    """transformers' tiny ViTForImageClassification, saved with save_pretrained (+ its image processor),
    in the Hub cache as acme/tiny-vit."""
    from transformers import ViTImageProcessor

    theirs = hf_model()
    theirs.save_pretrained(tmp_path / "saved")
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=list(IMAGENET.mean),
                      image_std=list(IMAGENET.std)).save_pretrained(tmp_path / "saved")
    put_in_hub_cache(tmp_path / "hf", OWNER_REPO, tmp_path / "saved")
    return theirs


def entry(**kw):
    """A registry entry with the agreed fields (what `vitlab.weights.registry.Entry` holds)."""
    base = dict(name="tiny-test", aliases=[], url=f"hf-hub:{OWNER_REPO}", filename=None, format="hf",
                variant="ViT-Ti/16", config={}, num_classes=3, img_size=32, preprocess=None, labels="animals-3",
                accuracy={"metric": "animals top-1", "value": 99.5, "source": "this test"}, license="apache-2.0",
                sha256=None, sha256_prefix=None, publisher="acme", notes="")
    return types.SimpleNamespace(**{**base, **kw})


# -- the Hub ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [f"hf-hub:{OWNER_REPO}", OWNER_REPO])
def test_transformers_repo_from_the_hub_cache_matches_transformers(hf_repo, name):
    ours = vitlab.load_model(name)
    assert ours.cfg.num_classes == 3 and ours.cfg.layer_norm_eps == 1e-12
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), hf_logits(hf_repo, x), atol=ATOL, rtol=0)
    assert ours.preprocess.mean == IMAGENET.mean  # from the repo's preprocessor_config.json
    assert read_metadata(name) == {"class_names": ["cat", "dog", "fox"]}
    assert read_config(name).embed_dim == 64


def test_revision_and_resolved_snapshot(hf_repo, tmp_path):
    put_in_hub_cache(tmp_path / "hf", OWNER_REPO, tmp_path / "saved", revision="v1.0")
    resolved = hub.resolve(f"hf-hub:{OWNER_REPO}@v1.0")
    commit = (tmp_path / "hf" / "models--acme--tiny-vit" / "refs" / "v1.0").read_text()
    assert resolved.path == tmp_path / "hf" / "models--acme--tiny-vit" / "snapshots" / commit
    assert resolved.entry is None
    with pytest.raises(WeightsError, match="not in the Hugging Face cache"):
        hub.resolve(f"hf-hub:{OWNER_REPO}@v2.0")


def test_timm_repo_from_the_hub_cache_matches_timm(tmp_path):
    import timm
    from timm.models._hub import save_for_hf

    theirs = timm.create_model("vit_tiny_patch16_224", img_size=32, embed_dim=128, depth=2, num_heads=2,
                               num_classes=4)
    theirs = perturb_(theirs).eval()
    save_for_hf(theirs, tmp_path / "timm_saved", safe_serialization=True)  # config.json + model.safetensors
    assert json.loads((tmp_path / "timm_saved" / "config.json").read_text())["architecture"] == "vit_tiny_patch16_224"
    put_in_hub_cache(tmp_path / "hf", TIMM_REPO, tmp_path / "timm_saved")
    # timm's config.json names the architecture (vit_tiny: width 192, 3 heads) and, in model_args, the keyword
    # arguments it was created with (width 128, 2 heads): those win, as in timm (vitlab.weights.timm_arch)
    ours, report = vitlab.load_model(TIMM_REPO, return_report=True)  # a bare timm hub tag
    assert (ours.cfg.num_classes, ours.cfg.img_size, ours.cfg.patch_size, ours.cfg.num_heads) == (4, 32, 16, 2)
    assert report.sources["num_heads"] == "config.json model_args"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_offline_with_nothing_cached_says_where_the_files_go(tmp_path):
    with pytest.raises(WeightsError) as e:
        vitlab.load_model("hf-hub:acme/not-downloaded")
    msg = str(e.value)
    assert "offline mode is on (HF_HUB_OFFLINE=1)" in msg
    assert str(tmp_path / "hf" / "models--acme--not-downloaded") in msg
    assert "config.json and model.safetensors / pytorch_model.bin" in msg
    with pytest.raises(WeightsError) as e:
        hub.resolve("acme/not-downloaded")  # a bare id: the message says what else was tried
    assert str(e.value).startswith("'acme/not-downloaded' is not a local file or directory and not a registry name")
    assert "tried it as a Hugging Face Hub repo: hf-hub:acme/not-downloaded is not in the Hugging Face cache" in \
        str(e.value)


def test_hub_unreachable_with_nothing_cached(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    go_online(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(time, "sleep", lambda s: None)  # huggingface_hub retries 5 times with back-off (23 s)
    with pytest.raises(WeightsError, match=r"not in the Hugging Face cache and the Hub cannot be reached"):
        hub.resolve("hf-hub:acme/not-downloaded")


class FakeHub(LocalServer):
    """The Hub's file protocol, as huggingface_hub uses it, in a thread: HEAD / GET /{repo}/resolve/{rev}/{file}
    answer with X-Repo-Commit and ETag, or 404 + X-Error-Code (EntryNotFound, RepoNotFound), or 403 GatedRepo."""

    def __init__(self, repos: dict[str, Path], gated: tuple[str, ...] = ()):
        import http.server
        import re

        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, body_too: bool):
                owner.requests.append((self.command, self.path, self.headers.get("Authorization")))
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
                repo, file = (m.group(1), m.group(3)) if m else (None, None)
                if repo in gated:
                    return self.fail(403, "GatedRepo")
                if repo not in repos:
                    return self.fail(404, "RepoNotFound")
                path = repos[repo] / file
                if not path.is_file():
                    return self.fail(404, "EntryNotFound")
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("X-Repo-Commit", hashlib.sha1(repo.encode()).hexdigest())
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body_too:
                    self.wfile.write(data)

            def fail(self, status: int, code: str):
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):
                self.answer(False)

            def do_GET(self):
                self.answer(True)

            def log_message(self, *args):
                pass

        self._serve(Handler)

    def files_fetched(self, repo: str) -> list[str]:
        return sorted({p.rsplit("/", 1)[1] for m, p, _ in self.requests if m == "GET" and p.startswith(f"/{repo}/")})


def test_download_from_a_hub_endpoint_takes_only_what_a_vit_needs(tmp_path, monkeypatch):
    theirs = hf_model()
    theirs.save_pretrained(tmp_path / "a")
    (tmp_path / "a" / "README.md").write_text("a model card")
    (tmp_path / "a" / "tf_model.h5").write_bytes(b"not needed")
    theirs.save_pretrained(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), tmp_path / "b" / "pytorch_model.bin")
    with FakeHub({"acme/a": tmp_path / "a", "acme/b": tmp_path / "b"}, gated=("acme/gated",)) as srv:
        go_online(monkeypatch)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.httpd.server_address[1]}")
        monkeypatch.setenv("HF_TOKEN", "hf_vitlab_test")
        x = torch.randn(2, 3, 32, 32)
        for repo in ("acme/a", "acme/b"):
            torch.testing.assert_close(vitlab.load_model(f"hf-hub:{repo}")(x), hf_logits(theirs, x), atol=ATOL, rtol=0)
        assert srv.files_fetched("acme/a") == ["config.json", "model.safetensors"]
        assert srv.files_fetched("acme/b") == ["config.json", "pytorch_model.bin"]
        assert {auth for _, p, auth in srv.requests if p.startswith("/acme/")} == {"Bearer hf_vitlab_test"}
        assert (tmp_path / "hf" / "models--acme--a" / "snapshots").is_dir()  # in the Hub's own cache
        with pytest.raises(WeightsError, match=r"hf-hub:acme/gated is gated: accept its terms .* set HF_TOKEN"):
            hub.resolve("hf-hub:acme/gated")
        with pytest.raises(WeightsError, match="hf-hub:acme/nope: no such Hub repo"):
            hub.resolve("hf-hub:acme/nope")
        with pytest.raises(WeightsError, match=r"'acme/nope' is not a local file .* tried it as a Hugging Face Hub"):
            hub.resolve("acme/nope")


def test_from_pretrained_downloads_as_load_model_does(tmp_path, monkeypatch):
    """`from_pretrained` and `load_model` share one Hub download: the same files fetched, the same errors, and
    from_pretrained's own token / cache_dir / force_download / local_files_only passed through."""
    ours = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32,
                                        patch_size=8, num_classes=3)).eval()
    vitlab.weights.save_pretrained(ours, tmp_path / "v", model_card=False)
    with FakeHub({"acme/v": tmp_path / "v"}, gated=("acme/gated",)) as srv:
        go_online(monkeypatch)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.httpd.server_address[1]}")
        x = torch.randn(2, 3, 32, 32)
        got = vitlab.weights.from_pretrained("acme/v", token="hf_mine", cache_dir=tmp_path / "c")
        torch.testing.assert_close(got(x), ours(x), atol=0, rtol=0)
        assert srv.files_fetched("acme/v") == ["config.json", "model.safetensors"]
        assert {auth for _, p, auth in srv.requests} == {"Bearer hf_mine"}
        assert (tmp_path / "c" / "models--acme--v" / "snapshots").is_dir() and not (tmp_path / "hf").exists()
        n = len(srv.requests)
        vitlab.weights.from_pretrained("hf-hub:acme/v", cache_dir=tmp_path / "c", force_download=True)
        assert len(srv.requests) > n  # asked the Hub again
        with pytest.raises(WeightsError, match=r"hf-hub:acme/gated is gated: accept its terms"):
            vitlab.weights.from_pretrained("acme/gated")
        with pytest.raises(WeightsError, match=r"hf-hub:acme/nope: no such Hub repo"):
            vitlab.weights.from_pretrained("acme/nope")
    with pytest.raises(WeightsError, match=r"offline mode is on \(local_files_only=True\).*vitlab weights get"):
        vitlab.weights.from_pretrained("acme/other", local_files_only=True)


def test_pytorch_model_bin_when_there_is_no_safetensors(tmp_path):
    theirs = hf_model()
    theirs.save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), tmp_path / "saved" / "pytorch_model.bin")
    put_in_hub_cache(tmp_path / "hf", OWNER_REPO, tmp_path / "saved")
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(vitlab.load_model(OWNER_REPO)(x), hf_logits(theirs, x), atol=ATOL, rtol=0)


# -- names ------------------------------------------------------------------------------------------------


def test_an_existing_local_folder_wins_over_a_repo_id(hf_repo, tmp_path):
    (tmp_path / "acme").mkdir()
    os.symlink(tmp_path / "saved", tmp_path / OWNER_REPO)
    loc, _ = hub.locate(OWNER_REPO)
    assert (loc.kind, loc.path) == ("path", Path(OWNER_REPO))
    assert hub.locate("acme/missing")[0].kind == "hub"  # a str that exists nowhere is tried further ...
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        hub.locate(Path("acme/missing"))  # ... but a Path is always a path


def test_parsing_names():
    loc, _ = hub.locate("hf-hub:google/vit-base-patch16-224@refs/pr/1")
    assert (loc.kind, loc.repo_id, loc.revision) == ("hub", "google/vit-base-patch16-224", "refs/pr/1")
    loc, _ = hub.locate("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    assert (loc.kind, loc.repo_id, loc.revision) == ("hub", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", None)
    loc, _ = hub.locate("HTTPS://example.com/a/b.pth#sha256=C867DB91")
    assert (loc.kind, loc.url, loc.sha256) == ("url", "HTTPS://example.com/a/b.pth", "c867db91")
    with pytest.raises(WeightsError, match="#sha256="):
        hub.locate("https://example.com/a/b.pth#md5=00")
    with pytest.raises(WeightsError, match="hf-hub:owner/repo"):
        hub.locate("hf-hub:just-a-name")


def test_unknown_names_say_what_was_tried(monkeypatch):
    install_registry(monkeypatch, [entry(name="vit_b_16.IMAGENET1K_V1")])
    with pytest.raises(FileNotFoundError) as e:
        hub.locate("runs/final.safetensors")  # a missing file, not a Hub repo
    assert "not a local file or directory, not a registry name" in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"close registry names: vit_b_16\.IMAGENET1K_V1"):
        hub.locate("vit_b_16.IMAGENET1K_V2")
    with pytest.raises(FileNotFoundError):
        vitlab.load_model("ViT-B_16.npz")


# -- registry entries -------------------------------------------------------------------------------------


def test_registry_entry_applies_its_config_and_preprocessing(hf_repo, monkeypatch):
    pre = dict(mean=list(IMAGENET.mean), std=list(IMAGENET.std), resize="center_crop", crop_fraction=0.875,
               interpolation="bicubic")
    install_registry(monkeypatch, [entry(aliases=["tiny"], config={"img_size": 48}, img_size=48, preprocess=pre)])
    for name in ("tiny-test", "tiny", f"hf-hub:{OWNER_REPO}"):  # the entry is found by name, alias and url
        model = vitlab.load_model(name)
        assert model.cfg.img_size == 48  # the entry's override: position embeddings resampled 4x4 -> 6x6
        assert model.preprocess == Preprocess(48, IMAGENET.mean, IMAGENET.std, "center_crop", 0.875, "bicubic",
                                              source="registry entry tiny-test")
    assert vitlab.load_model("tiny", img_size=32).cfg.img_size == 32  # the caller's override wins
    assert read_config("tiny").img_size == 48
    model = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, patch_size=8,
                                num_classes=3, layer_norm_eps=1e-12)
    vitlab.load_weights(model, "tiny")
    assert model.preprocess.resize == "center_crop" and model.preprocess.img_size == 224


def test_registry_entry_with_a_url_and_checksum(tmp_path, monkeypatch):
    ours = perturb_(vitlab.create_model("ViT-Ti/16", depth=1, img_size=32, patch_size=8, num_classes=2)).eval()
    vitlab.save_weights(ours, tmp_path / "m.safetensors")
    data = (tmp_path / "m.safetensors").read_bytes()
    with FileServer({"/m.safetensors": data, "/bad.safetensors": data + b"\0"}) as srv:
        install_registry(monkeypatch, [
            entry(name="good", url=srv.url("/m.safetensors"), sha256_prefix=sha(data)[:8], format="vitlab"),
            entry(name="bad", url=srv.url("/bad.safetensors"), sha256=sha(data), format="vitlab"),
        ])
        x = torch.randn(1, 3, 32, 32)
        monkeypatch.delenv("HF_HUB_OFFLINE")
        torch.testing.assert_close(vitlab.load_model("good")(x), ours(x), atol=0, rtol=0)
        with pytest.raises(WeightsError, match="checksum mismatch"):
            vitlab.load_model("bad")


def test_registry_checksum_of_a_hub_file(hf_repo, tmp_path, monkeypatch):
    digest = sha((tmp_path / "saved" / "model.safetensors").read_bytes())
    install_registry(monkeypatch, [entry(name="ok", filename="model.safetensors", sha256=digest),
                                   entry(name="other", url=f"hf-hub:{OWNER_REPO}@main", sha256_prefix="0123abcd")])
    assert hub.resolve("ok").path.name == hub.resolve(f"hf-hub:{OWNER_REPO}").path.name
    with pytest.raises(WeightsError, match=f"model.safetensors has sha256 {digest}, the registry expects 0123abcd"):
        hub.resolve("other")


def test_the_shipped_registry_names_resolve_to_locations(monkeypatch):
    monkeypatch.setitem(sys.modules, "vitlab.weights.registry", shipped_registry)
    monkeypatch.setattr(vitlab.weights, "registry", shipped_registry)
    loc, e = hub.locate("vit_b_16.IMAGENET1K_V1")
    file = "download.pytorch.org/models/vit_b_16-c867db91.pth"
    assert (loc.kind, loc.url, loc.sha256) == ("url", f"https://{file}", "c867db91")
    assert hub.cache_status(loc) == {"path": str(download.cache_root() / file), "cached": False}
    assert hub.entry_overrides(e)["num_classes"] == 1000
    loc, e = hub.locate("gs://vit_models/imagenet21k/ViT-B_16.npz")
    assert e.name == "gs://vit_models/imagenet21k/ViT-B_16.npz" and e.format == "npz"
    loc, e = hub.locate("google/vit-base-patch16-224")  # an alias of the Hub entry
    assert (loc.kind, loc.repo_id, e.name) == ("hub", "google/vit-base-patch16-224", f"hf-hub:{loc.repo_id}")
    for entry_ in shipped_registry.list_entries():
        loc, found = hub.locate(entry_.name)
        assert found == entry_ and loc.kind in ("hub", "url")
        assert hub.entry_preprocess(entry_).img_size == entry_.img_size


def test_get_a_hub_repo_into_a_folder_offline(hf_repo, tmp_path, capsys):
    assert main(["weights", "get", f"hf-hub:{OWNER_REPO}", "-o", "out"]) == 0
    assert capsys.readouterr().out.strip() == "out"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors",
                                                                    "preprocessor_config.json"]
    assert not (tmp_path / "out" / "model.safetensors").is_symlink()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(vitlab.load_model(tmp_path / "out")(x), hf_logits(hf_repo, x), atol=ATOL, rtol=0)


def test_convert_takes_a_hub_name(hf_repo, tmp_path, capsys):
    assert main(["convert", f"hf-hub:{OWNER_REPO}", "tiny.safetensors"]) == 0
    x = torch.randn(1, 3, 32, 32)
    converted = vitlab.load_model(tmp_path / "tiny.safetensors")
    torch.testing.assert_close(converted(x), hf_logits(hf_repo, x), atol=ATOL, rtol=0)
    assert converted.preprocess.mean == IMAGENET.mean


def test_create_model_with_weights(hf_repo, monkeypatch):
    arch = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, patch_size=8, img_size=32, layer_norm_eps=1e-12)
    model = vitlab.create_model("ViT-Ti/16", weights=f"hf-hub:{OWNER_REPO}", num_classes=3, **arch).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), hf_logits(hf_repo, x), atol=ATOL, rtol=0)
    install_registry(monkeypatch, [entry(config={"num_classes": 3, **arch})])
    model = vitlab.create_model("ViT-Ti/16", weights="tiny-test").eval()  # the entry's config builds it
    torch.testing.assert_close(model(x), hf_logits(hf_repo, x), atol=ATOL, rtol=0)
    fresh = vitlab.create_model("ViT-Ti/16", weights="tiny-test", num_classes=7)  # a new zero head
    assert fresh.head.out_features == 7 and torch.count_nonzero(fresh.head.weight) == 0


def test_recipe_init_checkpoint_takes_a_hub_name(hf_repo):
    from vitlab.train.loop import build_model
    from vitlab.train.recipe import Recipe

    arch = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, patch_size=8, img_size=48, layer_norm_eps=1e-12)
    recipe = Recipe.from_dict({"model": {"name": "ViT-Ti/16", **arch}, "init": {"checkpoint": OWNER_REPO},
                               "train": {"steps": 1}},
                              check_data=False)
    model = build_model(recipe, num_classes=10)
    assert model.init_report.format == "hf" and "pos_embed" in model.init_report.resampled
    reference = vitlab.load_model(OWNER_REPO)  # which matches transformers' logits (test above)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, reference.blocks[1].mlp.fc2.weight)
    assert torch.count_nonzero(model.head.weight) == 0  # init.drop_head: a new zero head for the 10 classes
    bad = Recipe.from_dict({"model": {"name": "ViT-Ti/16", **arch}, "init": {"checkpoint": "nowhere.safetensors"},
                            "train": {"steps": 1}},
                           check_data=False)
    with pytest.raises(FileNotFoundError, match=r"init\.checkpoint: no checkpoint at nowhere\.safetensors"):
        build_model(bad, num_classes=10)


# -- `vitlab weights` -------------------------------------------------------------------------------------


def test_cli_list_and_show(hf_repo, monkeypatch, capsys):
    pre = dict(mean=list(IMAGENET.mean), std=list(IMAGENET.std), resize="center_crop", crop_fraction=0.875)
    install_registry(monkeypatch, [entry(preprocess=pre), entry(name="gs://b/ViT-X.npz", url="https://h/ViT-X.npz",
                                                                 format="npz", accuracy=None, num_classes=21843)])
    assert main(["weights", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "variant", "res", "classes", "labels", "reported", "accuracy"]
    assert lines[1].split()[:6] == ["tiny-test", "ViT-Ti/16", "32", "3", "animals-3", "99.5"]
    assert lines[2].split()[:6] == ["gs://b/ViT-X.npz", "ViT-Ti/16", "32", "21843", "animals-3", "-"]
    assert main(["weights", "list", "--json"]) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out)] == ["tiny-test", "gs://b/ViT-X.npz"]

    assert main(["weights", "show", "tiny-test"]) == 0
    out = capsys.readouterr().out
    assert "ImageNet" in out or "imagenet" in out
    assert "(cached)" in out and "models--acme--tiny-vit" in out and "99.5 animals top-1 (source: this test)" in out
    assert main(["weights", "show", "gs://b/ViT-X.npz", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["cache"] == {"path": str(download.cache_root() / "h" / "ViT-X.npz"), "cached": False}
    # a misspelt name (a Hub id vitlab knows nothing of, not cached): exit 1, one line, the close names
    assert main(["weights", "show", "tiny-tset"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not a registry name" in err and "close registry names: tiny-test" in err, err
    assert main(["weights", "show", "acme/tiny-vti"]) == 1  # an owner/repo id: not listed, not cached
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not in the registry and not in the Hugging Face cache" in err, err


def test_cli_get_and_errors(tmp_path, monkeypatch, capsys):
    data = b"weights" * 1000
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with FileServer({"/w/ViT-Y.npz": data}) as srv:
        install_registry(monkeypatch, [entry(name="y", url=srv.url("/w/ViT-Y.npz"), sha256=sha(data))])
        assert main(["weights", "get", "y"]) == 0
        cached = Path(capsys.readouterr().out.strip())
        assert cached == download.url_cache_path(srv.url("/w/ViT-Y.npz")) and cached.read_bytes() == data
        assert main(["weights", "get", "y", "-o", str(tmp_path / "out")]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "ViT-Y.npz")
        assert (tmp_path / "out" / "ViT-Y.npz").read_bytes() == data
        assert len(srv.requests) == 1  # -o copied the verified cached file

        assert main(["weights", "get", "nothing-like-this"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("vitlab weights get: error: no checkpoint at nothing-like-this")
        monkeypatch.setenv("VITLAB_OFFLINE", "1")
        assert main(["weights", "get", srv.url("/other.npz")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "put the file at" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["weights"])
    assert e.value.code == 2
