"""The model against timm (same parameter names, so state dicts load unchanged) and closed-form checks."""

import doctest
import functools
import math

import pytest
import timm
import torch

import vitlab
from vitlab import ViTConfig, create_model
from vitlab.models.flops import count_flops, count_params
from vitlab.models.posembed import sincos_2d

from .conftest import perturb_

TINY = dict(embed_dim=64, depth=3, num_heads=4, mlp_dim=128, num_classes=10)


def _timm_twin(ours, **kw):
    cfg = ours.cfg
    timm_model = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        class_token=cfg.class_token, global_pool="token" if cfg.pool == "token" else "avg", fc_norm=False,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=cfg.layer_norm_eps), **kw,
    )
    timm_model.load_state_dict(ours.state_dict())
    return timm_model.eval()


@pytest.mark.parametrize(
    "overrides",
    [
        dict(img_size=32, patch_size=8),
        dict(img_size=(32, 48), patch_size=8),  # non-square grid
        dict(img_size=28, patch_size=4, in_chans=1),
        dict(img_size=32, patch_size=8, pool="gap", class_token=False),
    ],
)
def test_logits_match_timm(overrides):
    ours = perturb_(create_model("ViT-Ti/16", **TINY, **overrides)).eval()
    theirs = _timm_twin(ours)
    x = torch.randn(3, ours.cfg.in_chans, *ours.cfg.img_hw)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.forward_head(ours.forward_features(x), pre_logits=True),
                               theirs.forward_head(theirs.forward_features(x), pre_logits=True), atol=1e-5, rtol=1e-5)


def test_other_input_sizes_resample_pos_embed_like_timm():
    ours = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)).eval()
    theirs = _timm_twin(ours, dynamic_img_size=True)
    for hw in [(48, 48), (24, 40), (32, 32)]:
        x = torch.randn(2, 3, *hw)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_forward_intermediates_match_timm():
    ours = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)).eval()
    theirs = _timm_twin(ours)
    x = torch.randn(2, 3, 32, 32)
    final_o, inter_o = ours.forward_intermediates(x, indices=2)
    final_t, inter_t = theirs.forward_intermediates(x, indices=2)
    torch.testing.assert_close(final_o, final_t, atol=1e-5, rtol=1e-5)
    assert len(inter_o) == len(inter_t) == 2
    for a, b in zip(inter_o, inter_t):
        assert a.shape == (2, 64, 4, 4)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    only = ours.forward_intermediates(x, indices=[0, -1], output_fmt="NLC", intermediates_only=True)
    assert [t.shape for t in only] == [(2, 16, 64), (2, 16, 64)]


def test_attention_capture_is_exact_and_keeps_other_layers_fused():
    model = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, maps = model.forward_attention(x, layers=[1])
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    assert set(maps) == {1}
    attn = maps[1]
    assert attn.shape == (2, 4, 17, 17)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 17))
    # recompute layer 1's attention by hand from its input
    with torch.no_grad():
        h, _ = model.embed(x)
        h, _ = model.blocks[0](h)
        q, k, _ = model.blocks[1].attn.qkv(model.blocks[1].norm1(h)).reshape(2, 17, 3, 4, 16).permute(2, 0, 3, 1, 4)
        ref = (q @ k.transpose(-1, -2) / math.sqrt(16)).softmax(-1)
    torch.testing.assert_close(attn, ref, atol=1e-6, rtol=1e-5)
    _, all_maps = model.forward_attention(x)
    assert sorted(all_maps) == [0, 1, 2]
    with pytest.raises(ValueError, match="out of range"):
        model.forward_attention(x, layers=[3])


def test_bf16_training_path_matches_timm_fp32():
    """bf16 training on a CPU takes the explicit softmax(QK^T)V path (faster there than the fused kernel's
    backward); logits and gradients must still agree with timm's fp32 model to bf16 precision."""
    from vitlab.models.vit import _explicit_is_faster

    q = torch.randn(2, 4, 17, 16, dtype=torch.bfloat16)
    assert not _explicit_is_faster(q)  # no gradient wanted: the fused kernel
    assert _explicit_is_faster(q.requires_grad_())
    assert not _explicit_is_faster(q.float())  # fp32: the fused kernel
    assert not _explicit_is_faster(torch.randn(1, 1, 1025, 16, dtype=torch.bfloat16, requires_grad=True))

    ours = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)).train()
    theirs = _timm_twin(ours).train()
    x = torch.randn(4, 3, 32, 32)
    y = torch.randint(0, 10, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = ours(x)
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    ref = theirs(x)
    torch.nn.functional.cross_entropy(ref, y).backward()
    scale = ref.abs().max().item()
    torch.testing.assert_close(logits.float(), ref, atol=3e-2 * scale, rtol=0)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        g, g_ref = p.grad.float(), grads[name].grad
        assert torch.linalg.vector_norm(g - g_ref) <= 0.06 * torch.linalg.vector_norm(g_ref) + 1e-6, name


def test_pre_logits_layer_is_dense_tanh():
    model = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, representation_size=48)).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_features(x)
    ref = torch.tanh(feats[:, 0] @ model.pre_logits.fc.weight.T + model.pre_logits.fc.bias)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), ref)
    torch.testing.assert_close(model(x), ref @ model.head.weight.T + model.head.bias)
    assert "pre_logits.fc.weight" in model.state_dict()


def test_exact_parameter_counts_of_the_paper_ladder():
    # timm's published counts for these variants with a 1000-class head; L and H built on the meta device.
    expected = {"ViT-B/16": 86_567_656, "ViT-L/16": 304_326_632, "ViT-H/14": 632_045_800, "ViT-S/16": 22_050_664}
    for name, n in expected.items():
        with torch.device("meta"):
            model = create_model(name)
        assert sum(p.numel() for p in model.parameters()) == n == count_params(model.cfg)
    with torch.device("meta"):
        timm_l = timm.create_model("vit_large_patch32_224", num_classes=1000)
        ours_l = create_model("ViT-L/32")
    assert sum(p.numel() for p in ours_l.parameters()) == sum(p.numel() for p in timm_l.parameters())


def test_flops_closed_form_for_b16():
    cfg = ViTConfig.from_name("ViT-B/16")
    # 196 patches + class token; per block: 4TD^2 (qkv, proj) + 2T^2D (attention) + 2TDM (MLP) MACs.
    T, D, M = 197, 768, 3072
    macs = 196 * 3 * 256 * D + 12 * (4 * T * D * D + 2 * T * T * D + 2 * T * D * M) + D * 1000
    assert count_flops(cfg) == 2 * macs
    assert count_flops(cfg, backward=True) == 6 * macs


def test_names_and_overrides():
    assert vitlab.list_models()[0] == "ViT-Ti/16" and len(vitlab.list_models()) == 11
    for alias in ("vit-b/16", "ViT-B/16", "b/16", "vit_base_patch16_224", "VIT-B16"):
        assert ViTConfig.from_name(alias).name == "ViT-B/16"
    with pytest.raises(ValueError, match="known models: ViT-Ti/16, ViT-S/16"):
        create_model("ViT-X/16")
    model = create_model("ViT-Ti/16", depth=4, img_size=64, num_classes=7)
    assert (len(model.blocks), model.cfg.img_size, model.head.out_features, model.pos_embed.shape) == (
        4, 64, 7, (1, 17, 192))
    with pytest.raises(ValueError, match="unknown ViTConfig field"):
        create_model("ViT-Ti/16", widht=3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(embed_dim=100, num_heads=3), "not divisible by num_heads"),
        (dict(img_size=30), "not divisible by patch_size"),
        (dict(pool="token", class_token=False), "needs class_token=True"),
        (dict(pool="max"), "pool must be one of"),
        (dict(pos_embed="rope"), "pos_embed must be one of"),
        (dict(depth=0), "depth must be a positive int"),
        (dict(dropout=1.5), "dropout must be a probability"),
        (dict(img_size=(32, 48, 3)), "img_size must be an int or"),
    ],
)
def test_config_errors_name_the_problem(overrides, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig.from_name("ViT-Ti/16", **overrides)


def test_bad_inputs_are_clear_errors():
    model = create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)
    with pytest.raises(ValueError, match="not a multiple of the patch size 8"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="expects 3 input channels, got 1"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model(torch.randn(3, 32, 32))


def test_initialisation_follows_google():
    model = create_model("ViT-B/16")
    D = 768
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.cls_token) == 0
    assert abs(model.pos_embed.std().item() - 0.02) < 1e-3
    fan_in = 3 * 16 * 16
    assert abs(model.patch_embed.proj.weight.std().item() - 1 / math.sqrt(fan_in)) < 2e-3
    bound = math.sqrt(6 / (2 * D))  # xavier-uniform of each D x D q/k/v kernel, not of the fused 3D x D matrix
    qkv = model.blocks[0].attn.qkv.weight
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.99 * bound
    fc1 = model.blocks[0].mlp.fc1
    assert fc1.weight.abs().max() <= math.sqrt(6 / (D + 3072)) and 0 < fc1.bias.abs().max() < 1e-4
    # blocks must differ: catches a shared module ([block] * depth)
    assert not torch.equal(model.blocks[0].attn.qkv.weight, model.blocks[1].attn.qkv.weight)
    assert len({id(b) for b in model.blocks}) == 12


def test_every_parameter_gets_a_gradient_and_checkpointing_matches():
    model = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, representation_size=32))
    x = torch.randn(2, 3, 32, 32)
    model(x).square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    missing = [n for n, g in grads.items() if g is None or not g.abs().sum() > 0]
    assert not missing
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).square().mean().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("overrides, rows", [
    (dict(), 1),  # the class token (Eq. 4)
    (dict(distilled=True), 2),  # DeiT: class and distillation tokens
    (dict(reg_tokens=4, no_embed_class=True), 1),  # registers after the class token
    (dict(pool="gap", class_token=False), None),  # mean pooling reads every token: nothing to leave out
])
def test_pruned_last_block_gives_timms_logits_and_runs_the_head_rows_alone(overrides, rows):
    ours = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, **overrides)).eval()
    assert ours.head_rows == rows
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        full = ours(x)
        features, (_, maps) = ours.forward_features(x), ours.forward_attention(x, layers=[-1])
        if not overrides:  # timm's VisionTransformer, every token through every block
            torch.testing.assert_close(full, _timm_twin(ours)(x), atol=1e-5, rtol=1e-5)
        shapes = []
        ours.blocks[-1].register_forward_hook(lambda m, i, out: shapes.append(tuple(out[0].shape)))
        ours.prune_last_block = True
        torch.testing.assert_close(ours(x), full, atol=1e-5, rtol=1e-5)
        T = 16 + ours.num_prefix_tokens
        assert shapes == [(3, rows or T, 64)]  # the last block computed the head's rows only
        # features and attention maps keep every token: the same values as with the flag off
        assert torch.equal(ours.forward_features(x), features) and features.shape == (3, T, 64)
        assert torch.equal(ours.forward_attention(x, layers=[-1])[1][2], maps[2]) and maps[2].shape == (3, 4, T, T)


def test_pruned_last_block_trains_to_the_same_gradients():
    """The other tokens' outputs of the last block reach no loss: leaving them out changes no gradient."""
    model = perturb_(create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, distilled=True))
    model.distilled_training = True
    x = torch.randn(2, 3, 32, 32)
    grads = []
    for prune in (False, True):
        model.zero_grad()
        model.prune_last_block = prune
        cls, dist = model(x)
        (cls.square().mean() + dist.abs().mean()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-6, rtol=1e-5)


def test_sincos2d_closed_form_and_model():
    pe = sincos_2d(3, 4, 8)  # D/4 = 2 frequencies: omega = [1, 1/10000]
    assert pe.shape == (12, 8)
    y, x = 2, 3
    row = pe[y * 4 + x]
    omega = torch.tensor([1.0, 1e-4])
    expected = torch.cat([torch.sin(x * omega), torch.cos(x * omega), torch.sin(y * omega), torch.cos(y * omega)])
    torch.testing.assert_close(row, expected)
    model = create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8, pos_embed="sincos2d", pool="gap",
                         class_token=False)
    assert model.pos_embed is None and "pos_embed" not in model.state_dict()
    assert model(torch.randn(1, 3, 32, 48)).shape == (1, 10)


def test_reset_classifier_zero_head():
    model = create_model("ViT-Ti/16", **TINY, img_size=32, patch_size=8)
    model.reset_classifier(5)
    assert model.head.out_features == 5 and model.cfg.num_classes == 5
    assert torch.count_nonzero(model.head.weight) == 0
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 64)
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}


def test_docstring_examples_run():
    import vitlab.weights.factory

    result = doctest.testmod(vitlab.weights.factory, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
