"""Google vit_jax .npz: round trips, the `opt/target/` prefix, pre-logits and zero-head handling, "jax"
resampling on load against scipy, and the archive's layout checked by a NumPy forward pass written from
vit_jax's definitions (flax DenseGeneral attention with separate heads, HWIO patch kernel)."""

import numpy as np
import pytest
import scipy.ndimage
import torch

import vitlab
from vitlab.weights import WeightsError, WeightsWarning, npz

from .conftest import perturb_

TINY = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32, patch_size=8, num_classes=7)


def tiny(**kw):
    return perturb_(vitlab.create_model("ViT-Ti/16", **{**TINY, **kw})).eval()


def ref_forward(w: dict[str, np.ndarray], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """ViT logits straight from a vit_jax parameter archive, in NumPy (x: (B, H, W, C), NHWC as in JAX)."""

    def ln(v, p):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + eps) * w[p + "/scale"] + w[p + "/bias"]

    def gelu(v):
        from scipy.special import erf

        return 0.5 * v * (1 + erf(v / np.sqrt(2)))

    k = w["embedding/kernel"]  # (P, P, C, D)
    P = k.shape[0]
    B, H, W, C = x.shape
    patches = x.reshape(B, H // P, P, W // P, P, C).transpose(0, 1, 3, 2, 4, 5)  # (B, gh, gw, P, P, C)
    z = np.einsum("bijpqc,pqcd->bijd", patches, k) + w["embedding/bias"]
    z = z.reshape(B, -1, k.shape[-1])
    if "cls" in w:
        z = np.concatenate([np.broadcast_to(w["cls"], (B, 1, z.shape[-1])), z], axis=1)
    z = z + w["Transformer/posembed_input/pos_embedding"]
    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in w:
        g = f"Transformer/encoderblock_{i}/"
        a = g + "MultiHeadDotProductAttention_1/"
        y = ln(z, g + "LayerNorm_0")
        q, kk, v = (np.einsum("btd,dhk->bthk", y, w[a + n + "/kernel"]) + w[a + n + "/bias"]
                    for n in ("query", "key", "value"))
        logits = np.einsum("bqhk,bthk->bhqt", q, kk) / np.sqrt(q.shape[-1])
        att = np.exp(logits - logits.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("bhqt,bthk->bqhk", att, v)
        z = z + np.einsum("bqhk,hkd->bqd", o, w[a + "out/kernel"]) + w[a + "out/bias"]
        y = ln(z, g + "LayerNorm_2")
        m = gelu(y @ w[g + "MlpBlock_3/Dense_0/kernel"] + w[g + "MlpBlock_3/Dense_0/bias"])
        z = z + m @ w[g + "MlpBlock_3/Dense_1/kernel"] + w[g + "MlpBlock_3/Dense_1/bias"]
        i += 1
    z = ln(z, "Transformer/encoder_norm")
    feat = z[:, 0] if "cls" in w else z.mean(1)
    if "pre_logits/kernel" in w:
        feat = np.tanh(feat @ w["pre_logits/kernel"] + w["pre_logits/bias"])
    return feat @ w["head/kernel"] + w["head/bias"]


@pytest.mark.parametrize("kw", [dict(), dict(representation_size=24), dict(pool="gap", class_token=False),
                                dict(img_size=(32, 48)), dict(qkv_bias=False), dict(pos_embed="sincos2d")])
def test_npz_layout_matches_a_numpy_vit_jax_forward(tmp_path, kw):
    model = tiny(**kw)
    path = vitlab.save_weights(model, tmp_path / "m.npz")
    with np.load(path, allow_pickle=False) as f:
        w = {k: f[k].astype(np.float64) for k in f.files}
    assert w["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"].shape == (64, 4, 16)
    assert w["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel"].shape == (4, 16, 64)
    assert w["embedding/kernel"].shape == (8, 8, 3, 64)
    x = torch.randn(2, 3, *model.cfg.img_hw, dtype=torch.float64)
    expected = ref_forward(w, x.permute(0, 2, 3, 1).numpy())
    torch.testing.assert_close(model(x.float()).double(), torch.from_numpy(expected), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(representation_size=24), dict(pool="gap", class_token=False),
                                dict(in_chans=1, img_size=28, patch_size=4)])
def test_npz_round_trip_is_identical(tmp_path, kw):
    model = tiny(**kw)
    path = vitlab.save_weights(model, tmp_path / "m.npz")
    loaded, report = vitlab.load_model(path, return_report=True)
    assert report.format == "npz" and report.ok and "num_heads" not in report.inferred  # heads read from kernels
    assert loaded.cfg == model.cfg.replace(name=None)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and through a second trip the archive itself is unchanged
    vitlab.save_weights(loaded, tmp_path / "again.npz")
    with np.load(path) as f, np.load(tmp_path / "again.npz") as g:
        assert sorted(f.files) == sorted(g.files) and all(np.array_equal(f[k], g[k]) for k in f.files)


def test_opt_target_prefix_and_non_square_grid(tmp_path):
    model = tiny(img_size=(32, 48))
    path = vitlab.save_weights(model, tmp_path / "m.npz")
    with np.load(path) as f:
        np.savez(tmp_path / "prefixed.npz", **{"opt/target/" + k: f[k] for k in f.files})
    with pytest.raises(WeightsError, match=r"img_size=\(H, W\)"):  # 24 patch rows: not a square grid
        vitlab.load_model(tmp_path / "prefixed.npz")
    loaded = vitlab.load_model(tmp_path / "prefixed.npz", img_size=(32, 48))
    x = torch.randn(2, 3, 32, 48)
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_pre_logits_kept_or_dropped_with_warning(tmp_path):
    model = tiny(representation_size=24)
    path = vitlab.save_weights(model, tmp_path / "m.npz")
    keep = vitlab.create_model("ViT-Ti/16", **TINY, representation_size=24)
    assert vitlab.load_weights(keep, path).ok
    torch.testing.assert_close(keep.pre_logits.fc.weight, model.pre_logits.fc.weight)
    backbone = vitlab.create_model("ViT-Ti/16", **{**TINY, "num_classes": 0})
    with pytest.warns(WeightsWarning, match="pre-logits"):
        report = vitlab.load_weights(backbone, path)
    assert report.dropped == ["pre_logits.fc.bias", "pre_logits.fc.weight", "head.weight", "head.bias"]
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(backbone(x), model.forward_features(x)[:, 0])  # the backbone, without pre-logits
    # The paper's fine-tuning: pre-training head (pre-logits + head) removed, a zero head of the same classes.
    finetune = vitlab.create_model("ViT-Ti/16", **TINY)
    with pytest.warns(WeightsWarning, match="pre-logits"):
        report = vitlab.load_weights(finetune, path)
    assert report.replaced == ["head.weight", "head.bias"] and "pre-logits layer (input width 24)" in str(report)
    assert not finetune.head.weight.any()
    # Even when the widths agree (ImageNet-21k B/16: representation 768 = width 768) the head goes with them.
    same = perturb_(vitlab.create_model("ViT-Ti/16", **{**TINY, "representation_size": 64}))
    path = vitlab.save_weights(same, tmp_path / "same.npz")
    plain = vitlab.create_model("ViT-Ti/16", **TINY)
    with pytest.warns(WeightsWarning, match="pre-logits"):
        report = vitlab.load_weights(plain, path)
    assert report.replaced == ["head.weight", "head.bias"] and not plain.head.weight.any()


def test_zero_head_of_raw_21k_checkpoints_is_warned_about(tmp_path):
    model = tiny()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    path = vitlab.save_weights(model, tmp_path / "in21k.npz")
    with pytest.warns(WeightsWarning, match="all zeros"):
        vitlab.load_model(path)
    # fine-tuning to another class count replaces the head anyway: no warning, a message
    _, report = vitlab.load_model(path, return_report=True, num_classes=3)
    assert report.replaced == ["head.weight", "head.bias"] and "zero-initialised" in str(report)


def test_npz_resamples_like_scipy_zoom_by_default(tmp_path):
    """Google fine-tunes at higher resolution with scipy.ndimage.zoom(order=1) on the grid: our .npz default."""
    model = tiny()
    path = vitlab.save_weights(model, tmp_path / "m.npz")
    big, report = vitlab.load_model(path, return_report=True, img_size=(56, 40))
    assert "(jax)" in report.resampled["pos_embed"]
    grid = model.pos_embed[0, 1:].detach().reshape(4, 4, 64).double().numpy()
    zoomed = scipy.ndimage.zoom(grid, (7 / 4, 5 / 4, 1), order=1)
    torch.testing.assert_close(big.pos_embed[0, 1:].detach().double(), torch.from_numpy(zoomed.reshape(35, 64)),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(big.pos_embed[0, 0], model.pos_embed[0, 0])


def test_bad_archives_are_clear_errors(tmp_path):
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(WeightsError, match="not a vit_jax"):
        vitlab.load_model(tmp_path / "other.npz")
    np.savez(tmp_path / "hybrid.npz", **{"conv_root/kernel": np.zeros((7, 7, 3, 64)),  # a truncated hybrid
                                         "embedding/kernel": np.zeros((1, 1, 1024, 768))})
    with pytest.raises(WeightsError, match="no Transformer blocks"):
        vitlab.load_model(tmp_path / "hybrid.npz")


def test_hybrid_with_sorted_keys_as_google_writes_them(tmp_path):
    """Google's files store keys sorted, so Transformer/... comes before block1/... and conv_root/... (user
    report: reading R50+ViT-B_16.npz died with "'str' object is not callable")."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=1, num_heads=4, mlp_dim=128, num_classes=5,
                                         img_size=32, patch_size=1, hybrid_layers=(1,), hybrid_width=32)).eval()
    path = vitlab.save_weights(model, tmp_path / "ours.npz")
    with np.load(path) as f:
        arrays = {k: f[k] for k in sorted(f.files)}
    assert next(iter(arrays)).startswith("Transformer/") and "conv_root/kernel" in arrays
    np.savez(tmp_path / "sorted.npz", **arrays)
    loaded = vitlab.load_model(tmp_path / "sorted.npz")
    assert loaded.cfg == model.cfg.replace(name=None, hybrid_eps="vit_jax")  # Google's layout: Google's epsilons
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_current_flax_names_are_read(tmp_path):
    """flax.linen numbers submodules per type (LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
    MlpBlock_0); the released files have pre-Linen numbers (LayerNorm_0, ..._1, LayerNorm_2, MlpBlock_3). Like
    vit_jax's checkpoint.load (flax's convert_pre_linen), we renumber per type in the order of the numbers."""
    linen = {"LayerNorm_0": "LayerNorm_0", "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
             "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
    model = tiny(representation_size=24)
    path = vitlab.save_weights(model, tmp_path / "released.npz")
    with np.load(path) as f:
        arrays = {"/".join(linen.get(p, p) for p in k.split("/")): f[k] for k in f.files}
    assert "Transformer/encoderblock_1/MlpBlock_0/Dense_1/kernel" in arrays
    np.savez(tmp_path / "current.npz", **arrays)
    loaded = vitlab.load_model(tmp_path / "current.npz")
    assert loaded.cfg == model.cfg.replace(name=None)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # numbers in numeric order, per type, per parent; anything else is left alone
    assert npz._linen_names(["a/Dense_10/kernel", "a/Dense_3/kernel", "a/LayerNorm_4/scale", "b/Dense_7/bias",
                             "block1/unit1/conv1/kernel"]) == {
        "a/Dense_10/kernel": "a/Dense_1/kernel", "a/Dense_3/kernel": "a/Dense_0/kernel",
        "a/LayerNorm_4/scale": "a/LayerNorm_0/scale", "b/Dense_7/bias": "b/Dense_0/bias",
        "block1/unit1/conv1/kernel": "block1/unit1/conv1/kernel"}
    # a third LayerNorm in a block is not ours to read: the error names the file's own key
    arrays["Transformer/encoderblock_0/LayerNorm_7/scale"] = np.ones(64, np.float32)
    np.savez(tmp_path / "extra.npz", **arrays)
    with pytest.raises(WeightsError, match="encoderblock_0/LayerNorm_7/scale"):
        vitlab.load_model(tmp_path / "extra.npz")


def test_one_name_table_read_both_ways():
    """Writing and reading use the same table: a model that has every kind of tensor (hybrid ResNet with a
    downsampling unit, pre-logits, head) uses every row, both ways, and comes back bit for bit."""
    model = perturb_(vitlab.create_model("ViT-Ti/16", **{**TINY, "patch_size": 1}, hybrid_layers=(2, 1),
                                         representation_size=24)).eval()
    state = model.state_dict()
    arrays, _ = npz.from_ours(state, model.cfg)
    unused = [row.theirs for row in npz._TABLE if not any(npz._pattern(row.theirs).fullmatch(k) for k in arrays)]
    assert unused == []  # every row written
    back, hints = npz.to_ours(arrays, "x")
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert hints["num_heads"] == TINY["num_heads"] and hints["hybrid_eps"] == "vit_jax"
    # what has no row is an error both ways, never dropped in silence
    with pytest.raises(WeightsError, match=r"no vit_jax name for .*blocks\.0\.attn\.extra"):
        npz.from_ours({**state, "blocks.0.attn.extra": torch.ones(1)}, model.cfg)
    arrays.pop("Transformer/encoderblock_1/MultiHeadDotProductAttention_1/value/bias")
    with pytest.raises(WeightsError, match=r"blocks\.1\.attn\.qkv\.bias needs query, key and value"):
        npz.to_ours(arrays, "x")
