"""big_vision `.npz` checkpoints against the logits of Google's own big_vision code.

The fixtures in tests/fixtures/big_vision/ were written by `make_fixtures.py` there (big_vision's `vit.Model`,
flax; see its header): a plain gap model with a learned table and numbered blocks, and a class-token model with
sin-cos position embeddings, a pre-logits layer and scanned blocks, each with big_vision's logits on fixed inputs;
and a MAP-head model that vitlab cannot express.

GELU: big_vision's MLP uses flax's default `nn.gelu`, the tanh approximation; vitlab's is exact. So each file is
checked twice: against big_vision's logits with only the GELU made exact (`logits_exact_gelu`, same parameters,
same code otherwise), to 1e-5 (the conversion itself; measured 3e-7), and against big_vision's own logits to
5e-4: the two GELUs differ by at most 4.7e-4 per activation (at |x| near 2), which on these fixtures moves the
logits by 1.1e-4 (gap_learn) and 1.2e-4 (tok_sincos_scan), as make_fixtures.py prints. That the whole gap is the
GELU is checked by swapping in PyTorch's tanh GELU, which then matches big_vision's own logits to 1e-5.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from vitlab.weights import WeightsError
from vitlab.weights.checkpoint import read_checkpoint

from .conftest import perturb_

HERE = Path(__file__).parent / "fixtures" / "big_vision"
EXPECTED = np.load(HERE / "expected.npz")
IMAGES = torch.from_numpy(EXPECTED["images"]).permute(0, 3, 1, 2)  # NHWC (JAX) -> NCHW
EXACT_GELU_ATOL = 1e-5
TANH_GELU_ATOL = 5e-4


def logits(model: vitlab.VisionTransformer) -> np.ndarray:
    with torch.no_grad():
        return model(IMAGES).numpy()


def check_logits(model: vitlab.VisionTransformer, name: str) -> None:
    out = logits(model)
    np.testing.assert_allclose(out, EXPECTED[f"{name}/logits_exact_gelu"], atol=EXACT_GELU_ATOL, rtol=0)
    np.testing.assert_allclose(out, EXPECTED[f"{name}/logits"], atol=TANH_GELU_ATOL, rtol=0)
    acts = [block.mlp.act for block in model.blocks]
    try:  # the whole remaining gap is the GELU: with flax's tanh form, big_vision's own logits match as closely
        for block in model.blocks:
            block.mlp.act = torch.nn.GELU(approximate="tanh")
        np.testing.assert_allclose(logits(model), EXPECTED[f"{name}/logits"], atol=EXACT_GELU_ATOL, rtol=0)
    finally:
        for block, act in zip(model.blocks, acts, strict=True):
            block.mlp.act = act


def arrays(name: str) -> dict[str, np.ndarray]:
    with np.load(HERE / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def test_gap_learned_unscanned_reproduces_big_vision():
    model, report = vitlab.load_model(HERE / "gap_learn.npz", return_report=True)
    assert report.format == "big_vision"
    cfg = model.cfg
    assert (cfg.pool, cfg.class_token, cfg.pos_embed) == ("gap", False, "learned")
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.patch_size) == (8, 2, 2, 16, 4)
    assert (cfg.img_size, cfg.num_classes, cfg.representation_size) == (12, 5, None)
    check_logits(model, "gap_learn")


def test_tok_sincos_scanned_reproduces_big_vision():
    model, report = vitlab.load_model(HERE / "tok_sincos_scan.npz", return_report=True)
    assert any("img_size=224 assumed" in m for m in report.messages)  # a sin-cos file does not fix the size
    cfg = model.cfg
    assert (cfg.pool, cfg.class_token, cfg.pos_embed, cfg.representation_size) == ("token", True, "sincos2d", 6)
    assert (cfg.depth, cfg.num_heads) == (2, 2)
    check_logits(model, "tok_sincos_scan")


def test_scanned_and_unscanned_files_load_the_same_tensors(tmp_path):
    """gap_learn stacked as big_vision's `pyloop_to_scan` stacks it (np.stack of each block's tensors)."""
    a = arrays("gap_learn")
    blocks = "params/Transformer/encoderblock_"
    scanned = {k: v for k, v in a.items() if not k.startswith(blocks)}
    for k in a:
        if k.startswith(blocks + "0/"):
            rest = k.removeprefix(blocks + "0/")
            scanned[f"params/Transformer/encoderblock/{rest}"] = np.stack([a[f"{blocks}{i}/{rest}"] for i in (0, 1)])
    np.savez(tmp_path / "scanned.npz", **scanned)
    ours, theirs = read_checkpoint(HERE / "gap_learn.npz").state, read_checkpoint(tmp_path / "scanned.npz").state
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(theirs[k], ours[k], atol=0, rtol=0)


def test_bare_params_and_pre_2022_names_load(tmp_path):
    """Files shared as bare parameters (no params/ prefix), with the pre-linen block names (LayerNorm_2,
    MultiHeadDotProductAttention_1, MlpBlock_3) and the table inside Transformer/, which big_vision's loader
    (`fix_old_checkpoints`, flax's `convert_pre_linen`) still accepts."""
    old = {"LayerNorm_1": "LayerNorm_2", "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
           "MlpBlock_0": "MlpBlock_3"}
    renamed = {}
    for k, v in arrays("gap_learn").items():
        k = k.removeprefix("params/").replace("pos_embedding", "Transformer/pos_embedding")
        for new, was in old.items():
            k = k.replace(f"/{new}/", f"/{was}/")
        renamed[k] = v
    np.savez(tmp_path / "bare.npz", **renamed)
    model, report = vitlab.load_model(tmp_path / "bare.npz", return_report=True)
    assert report.format == "big_vision"
    check_logits(model, "gap_learn")


def test_bare_unscanned_sincos_file_is_not_taken_for_vit_jax(tmp_path):
    """Without a prefix and without a position table (sincos2d), the blocks alone say big_vision: a vit_jax file
    always has Transformer/posembed_input/pos_embedding. A vit_jax file stays with the vit_jax reader."""
    bare = {}
    for k, v in arrays("tok_sincos_scan").items():
        k = k.removeprefix("params/")
        if k.startswith("Transformer/encoderblock/"):
            bare |= {k.replace("encoderblock/", f"encoderblock_{i}/"): v[i] for i in range(len(v))}
        else:
            bare[k] = v
    np.savez(tmp_path / "bare.npz", **bare)
    model, report = vitlab.load_model(tmp_path / "bare.npz", return_report=True)
    assert (report.format, model.cfg.pos_embed) == ("big_vision", "sincos2d")
    check_logits(model, "tok_sincos_scan")
    vitlab.save_weights(model, tmp_path / "vit_jax.npz")
    assert read_checkpoint(tmp_path / "vit_jax.npz").format == "npz"


def test_class_token_with_pre_2022_combined_table(tmp_path):
    """Before 2022 big_vision added the table after prepending `cls`, so it had N + 1 rows; big_vision's
    `fix_old_checkpoints` folds row 0 into `cls` (cls + r0, rows 1..N). Both forms must compute the same logits."""
    rng = np.random.default_rng(0)
    cls, r0 = (rng.normal(size=(1, 1, 8)).astype(np.float32) for _ in range(2))
    a = arrays("gap_learn")
    pos = a.pop("params/pos_embedding")
    np.savez(tmp_path / "old.npz", **a, **{"params/cls": cls, "params/pos_embedding": np.concatenate([r0, pos], 1)})
    np.savez(tmp_path / "new.npz", **a, **{"params/cls": cls + r0, "params/pos_embedding": pos})
    old, new = vitlab.load_model(tmp_path / "old.npz"), vitlab.load_model(tmp_path / "new.npz")
    assert old.cfg.pool == new.cfg.pool == "token"
    torch.testing.assert_close(old.pos_embed.data[0, 1:], torch.from_numpy(pos[0]), atol=0, rtol=0)
    torch.testing.assert_close(new.pos_embed.data[0, 0], torch.zeros(8), atol=0, rtol=0)  # cls has no position
    torch.testing.assert_close(torch.from_numpy(logits(old)), torch.from_numpy(logits(new)), atol=1e-5, rtol=0)


def test_bfloat16_file(tmp_path):
    """np.savez writes bfloat16 (ml_dtypes) as 2-byte void; it is read as the bfloat16 values, widened."""
    a = arrays("gap_learn")
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16).view("V2") for k, v in a.items()}
    np.savez(tmp_path / "bf16.npz", **bits)
    state = read_checkpoint(tmp_path / "bf16.npz").state
    want = torch.from_numpy(a["params/embedding/kernel"]).to(torch.bfloat16)  # differs from truncation by 1 ulp
    got = state["patch_embed.proj.weight"].permute(2, 3, 1, 0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.float(), atol=0, rtol=2**-7)


def test_timm_reads_the_same_file_alike():
    """timm's big_vision branch of `_load_weights` on the same file gives our logits (both exact GELU)."""
    timm = pytest.importorskip("timm")
    from timm.models.vision_transformer import _load_weights

    peer = timm.models.VisionTransformer(img_size=12, patch_size=4, embed_dim=8, depth=2, num_heads=2, mlp_ratio=2,
                                         num_classes=5, class_token=False, global_pool="avg", fc_norm=False).eval()
    _load_weights(peer, str(HERE / "gap_learn.npz"))
    with torch.no_grad():
        want = peer(IMAGES).numpy()
    np.testing.assert_allclose(logits(vitlab.load_model(HERE / "gap_learn.npz")), want, atol=1e-5, rtol=0)


def test_map_head_made_by_big_vision_loads_as_timm_reads_it():
    """map.npz, written by big_vision's own `vit.Model(pool_type="map")`: our MAP head (`attn_pool`) computes what
    timm's big_vision reader (`_load_weights` into `VisionTransformer(global_pool="map")`) makes of the same file."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer import _load_weights

    ours = vitlab.load_model(HERE / "map.npz")
    assert (ours.cfg.pool, ours.cfg.class_token, ours.cfg.num_heads, ours.cfg.img_size) == ("map", False, 2, 12)
    theirs = TimmViT(img_size=12, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_ratio=2.0, num_classes=5,
                     class_token=False, global_pool="map").eval()
    _load_weights(theirs, str(HERE / "map.npz"))
    x = torch.randn(3, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_unknown_tensor_is_named(tmp_path):
    a = arrays("gap_learn")
    a["params/Transformer/encoderblock_1/LayerScale_0/scale"] = np.ones(8, np.float32)
    np.savez(tmp_path / "extra.npz", **a)
    with pytest.raises(WeightsError, match=r"extra\.npz: unknown big_vision ViT parameter "
                                           r"'params/Transformer/encoderblock_1/LayerScale_0/scale'"):
        read_checkpoint(tmp_path / "extra.npz")


def test_a_big_vision_file_that_is_not_a_vit(tmp_path):
    np.savez(tmp_path / "bit.npz", **{"params/root_block/conv_root/kernel": np.zeros((7, 7, 3, 8), np.float32)})
    with pytest.raises(WeightsError, match=r"bit\.npz: .*not a ViT .*params/root_block/conv_root/kernel"):
        read_checkpoint(tmp_path / "bit.npz")


def _timm_to_big_vision(model) -> dict:
    """A timm SigLIP-style ViT (no class token, MAP head) in big_vision's names (params/ prefix, current flax names,
    numbered blocks, the table at the top): the inverse of what timm's `_load_weights` reads, checked below by
    reading it back with timm's reader."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    D = model.embed_dim
    H = model.blocks[0].attn.num_heads
    p = {"embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
         "embedding/bias": sd["patch_embed.proj.bias"], "pos_embedding": sd["pos_embed"],
         "Transformer/encoder_norm/scale": sd["norm.weight"], "Transformer/encoder_norm/bias": sd["norm.bias"]}
    for i in range(len(model.blocks)):
        b, o = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        for ln, name in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_1")):
            p[f"{o}{name}/scale"], p[f"{o}{name}/bias"] = sd[f"{b}{ln}.weight"], sd[f"{b}{ln}.bias"]
        w, bias = sd[f"{b}attn.qkv.weight"], sd[f"{b}attn.qkv.bias"]
        for j, n in enumerate(("query", "key", "value")):
            p[f"{o}MultiHeadDotProductAttention_0/{n}/kernel"] = w[j * D:(j + 1) * D].T.reshape(D, H, D // H)
            p[f"{o}MultiHeadDotProductAttention_0/{n}/bias"] = bias[j * D:(j + 1) * D].reshape(H, D // H)
        p[f"{o}MultiHeadDotProductAttention_0/out/kernel"] = sd[f"{b}attn.proj.weight"].T.reshape(H, D // H, D)
        p[f"{o}MultiHeadDotProductAttention_0/out/bias"] = sd[f"{b}attn.proj.bias"]
        for j in (0, 1):
            p[f"{o}MlpBlock_0/Dense_{j}/kernel"] = sd[f"{b}mlp.fc{j + 1}.weight"].T
            p[f"{o}MlpBlock_0/Dense_{j}/bias"] = sd[f"{b}mlp.fc{j + 1}.bias"]
    m, a = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/"
    p[m + "probe"] = sd["attn_pool.latent"]
    kv_w, kv_b = sd["attn_pool.kv.weight"], sd["attn_pool.kv.bias"]
    for n, w, bias in (("query", sd["attn_pool.q.weight"], sd["attn_pool.q.bias"]), ("key", kv_w[:D], kv_b[:D]),
                       ("value", kv_w[D:], kv_b[D:])):
        p[f"{a}{n}/kernel"], p[f"{a}{n}/bias"] = w.T.reshape(D, H, D // H), bias.reshape(H, D // H)
    p[a + "out/kernel"] = sd["attn_pool.proj.weight"].T.reshape(H, D // H, D)
    p[a + "out/bias"] = sd["attn_pool.proj.bias"]
    p[m + "LayerNorm_0/scale"], p[m + "LayerNorm_0/bias"] = sd["attn_pool.norm.weight"], sd["attn_pool.norm.bias"]
    for j in (0, 1):
        p[f"{m}MlpBlock_0/Dense_{j}/kernel"] = sd[f"attn_pool.mlp.fc{j + 1}.weight"].T
        p[f"{m}MlpBlock_0/Dense_{j}/bias"] = sd[f"attn_pool.mlp.fc{j + 1}.bias"]
    return {f"params/img/{k}": v for k, v in p.items()}


def test_siglip_map_head_loads_as_timm_reads_it(tmp_path):
    """A big_vision SigLIP image tower (pool_type='map': no class token, MAP head) loads with pool='map'; timm's own
    big_vision reader (`_load_weights`) on the same file is the reference."""
    import timm
    from timm.models.vision_transformer import _load_weights

    kw = dict(pretrained=False, depth=2, embed_dim=96, num_heads=3, img_size=32, num_classes=0)
    theirs = perturb_(timm.create_model("vit_base_patch16_siglip_224", **kw), scale=0.05).eval()
    np.savez(tmp_path / "siglip.npz", **_timm_to_big_vision(theirs))
    reread = timm.create_model("vit_base_patch16_siglip_224", **kw).eval()
    _load_weights(reread, str(tmp_path / "siglip.npz"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reread(x), theirs(x))  # the file says what the model is, as timm reads it
        ours, report = vitlab.load_model(tmp_path / "siglip.npz", return_report=True)
        torch.testing.assert_close(ours(x), reread(x), atol=1e-5, rtol=1e-5)
    assert (ours.cfg.pool, ours.cfg.class_token, ours.cfg.num_heads) == ("map", False, 3)
    assert report.format == "big_vision" and "query kernel" in report.sources["num_heads"]
