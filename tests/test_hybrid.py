"""The hybrid (ResNet feature map -> tokens, paper Sec. 3.1) against timm's ResNetV2 hybrids: logits, parameter
counts, FLOPs against PyTorch's own FLOP counter, and the errors a wrong configuration gets."""

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from vitlab import ViTConfig
from vitlab.models.config import canonical_name
from vitlab.models.flops import count_flops, count_params

from .conftest import perturb_

ATOL = 1e-4


def timm_hybrid(name: str, **kw):
    kw = dict(dict(embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5), **kw)
    return perturb_(timm.create_model(name, pretrained=False, **kw)).eval()


@pytest.mark.parametrize("name,kw,x_hw", [
    ("vit_small_r26_s32_224", dict(img_size=64), (64, 64)),  # 4 stages: stride 32, 2x2 tokens
    ("vit_tiny_r_s16_p8_224", dict(img_size=64), (64, 64)),  # bare stem, 8x8 patches of its feature map
    ("vit_small_r26_s32_224", dict(img_size=64, in_chans=1), (64, 64)),
])
def test_timm_hybrid_files_load_and_match(tmp_path, name, kw, x_hw):
    theirs = timm_hybrid(name, **kw)
    save_file(theirs.state_dict(), str(tmp_path / "hybrid.safetensors"))
    ours, report = vitlab.load_model(tmp_path / "hybrid.safetensors", return_report=True, num_heads=4)
    assert report.ok, report
    layers = (2, 2, 2, 2) if "r26" in name else ()
    assert ours.cfg.hybrid_layers == layers and ours.cfg.hybrid_width == 64 and ours.cfg.img_size == 64
    x = torch.randn(2, kw.get("in_chans", 3), *x_hw)
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_odd_sizes_use_tensorflow_same_padding_like_timm():
    """"SAME" padding differs from PyTorch's symmetric padding exactly on odd intermediate sizes."""
    ours = vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5,
                               patch_size=2, hybrid_layers=(), img_size=(72, 40)).eval()
    theirs = timm_hybrid("vit_tiny_r_s16_p8_224", img_size=(72, 40), patch_size=2)
    ours.load_state_dict(theirs.state_dict())  # same names, same shapes
    x = torch.randn(2, 3, 72, 40)  # stem conv pads 2 top / 3 bottom, pool 0 / 1: 36x20 -> 18x10; patches: 9x5
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=0)


def test_r50_vit_b16_matches_timm_parameter_count_and_names():
    with torch.device("meta"):
        theirs = timm.create_model("vit_base_r50_s16_384", pretrained=False)
        ours = vitlab.create_model("R50+ViT-B/16", img_size=384)
    theirs_names = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    ours_names = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert ours_names == theirs_names
    assert count_params(ours.cfg) == sum(p.numel() for p in theirs.parameters())
    assert canonical_name("vit_base_r50_s16_384") == "R50+ViT-B/16"
    assert canonical_name("r50+vit-b/16") == "R50+ViT-B/16"


@pytest.mark.parametrize("layers", [(), (1,), (2, 1), (1, 1, 2)])
def test_flop_count_equals_pytorch_flop_counter(layers):
    cfg = ViTConfig(img_size=64, patch_size=1, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5,
                    hybrid_layers=layers, hybrid_width=32)
    model = vitlab.create_model(cfg).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.forward_attention(torch.randn(1, 3, 64, 64))  # explicit QK^T and AV: the counter sees them
    assert count_flops(cfg) == counter.get_total_flops()
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def test_hybrid_trains_every_parameter():
    model = vitlab.create_model("ViT-Ti/16", img_size=28, in_chans=1, patch_size=1, embed_dim=64, depth=1,
                                num_heads=2, mlp_dim=64, num_classes=3, hybrid_layers=(1,), hybrid_width=32)
    model.head.weight.data.normal_()  # the zero head would stop every gradient below it
    model(torch.randn(4, 1, 28, 28)).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("kw,match", [
    (dict(hybrid_layers=(0,)), "hybrid_layers"),
    (dict(hybrid_layers=(1, 1, 1, 1, 1)), "hybrid_layers"),
    (dict(hybrid_layers=(1,), hybrid_width=48), "multiple of 32"),
    (dict(hybrid_layers=(1, 1), img_size=36, patch_size=1), "pixels per token 8"),
])
def test_bad_hybrid_configs_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**dict(dict(img_size=32, patch_size=1), **kw))


def test_wrong_input_size_names_the_hybrid_stride():
    model = vitlab.create_model("ViT-Ti/16", img_size=32, patch_size=1, depth=1, hybrid_layers=(1, 1),
                                hybrid_width=32)
    with pytest.raises(ValueError, match="ResNet stride x patch size"):
        model(torch.randn(1, 3, 36, 36))


@pytest.mark.parametrize("name", ["vit_small_r26_s32_224", "vit_tiny_r_s16_p8_224"])
def test_vit_jax_npz_of_a_hybrid_is_read_by_timms_reader_and_ours(tmp_path, name):
    """Our .npz in Google's hybrid layout (conv_root, block{s}/unit{u}/...): timm's vit_jax reader loads it into
    its own hybrid with equal logits, and our reader reads it back."""
    from timm.models.vision_transformer import _load_weights as timm_load_npz

    layers = (2, 2, 2, 2) if "r26" in name else ()
    ours = perturb_(vitlab.create_model("ViT-Ti/16", embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5,
                                        img_size=64, patch_size=1 if layers else 8, hybrid_layers=layers)).eval()
    path = tmp_path / "hybrid.npz"
    vitlab.save_weights(ours, path)
    theirs = timm.create_model(name, pretrained=False, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
                               num_classes=5, img_size=64).eval()
    with torch.no_grad():
        timm_load_npz(theirs, str(path))
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(theirs(x), ours(x), atol=ATOL, rtol=0)
    back = vitlab.load_model(path).eval()
    assert back.cfg.hybrid_layers == layers and back.cfg.hybrid_eps == "vit_jax"  # Google's layout, Google's eps
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("hw", [(14, 14), (9, 5), (28, 29)])
def test_fast_paths_equal_the_plain_same_convolution_and_pool(hw):
    """The subsample-then-1x1 projection and the channels-last pool equal plain "SAME" ops, values and gradients."""
    from vitlab.models.hybrid import MaxPoolSame, StdConv2d, _same_pad

    conv = StdConv2d(8, 16, 1, stride=2)
    x = torch.randn(2, 8, *hw, requires_grad=True)
    w = conv.weight
    ref_w = (w - w.mean((1, 2, 3), keepdim=True)) / torch.sqrt(w.var((1, 2, 3), keepdim=True, unbiased=False)
                                                               + conv.eps)
    for ours, ref in [(conv(x), F.conv2d(x, ref_w, None, 2)),
                      (MaxPoolSame()(x), F.max_pool2d(_same_pad(x, 3, 2, float("-inf")), 3, 2))]:
        assert ours.shape[-2:] == tuple(-(-s // 2) for s in hw)  # "SAME": ceil(in / stride)
        g = torch.randn_like(ref)
        grad_ours = torch.autograd.grad(ours, x, g)[0]
        grad_ref = torch.autograd.grad(ref, x, g)[0]
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(grad_ours, grad_ref)


def test_epsilon_conventions_of_timm_and_vit_jax():
    """"timm" is timm's StdConv2dSame(eps=1e-8) + GroupNormAct (eps 1e-5); "vit_jax" is models_resnet.py's
    (w - mean) / (std + 1e-5) and flax's GroupNorm eps 1e-6 (its logits: tests/test_weights_vitjax_fixture.py).
    A filter of variance 1e-8 tells them apart."""
    from timm.layers import GroupNormAct as TimmGroupNormAct
    from timm.layers import StdConv2dSame

    from vitlab.models.hybrid import GroupNormAct, StdConv2d

    theirs = StdConv2dSame(8, 64, 3, stride=2, bias=False, eps=1e-8)
    torch.nn.init.normal_(theirs.weight, std=0.1)
    with torch.no_grad():
        theirs.weight[0] *= 1e-4 / theirs.weight[0].std(unbiased=False)
    x = torch.randn(2, 8, 9, 9)
    for eps in ("timm", "vit_jax"):
        ours = StdConv2d(8, 64, 3, 2, eps)
        ours.load_state_dict(theirs.state_dict())
        w = theirs.weight.double()
        mean, std = w.mean((1, 2, 3), keepdim=True), w.std((1, 2, 3), keepdim=True, unbiased=False)
        w = (w - mean) / (torch.sqrt(std**2 + 1e-8) if eps == "timm" else std + 1e-5)
        want = F.conv2d(x.double(), w, stride=2, padding=1)  # SAME: 9 -> 5, one pixel each side
        torch.testing.assert_close(ours(x).double(), want, atol=1e-5, rtol=0)
        if eps == "timm":
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)
        else:
            assert (ours(x)[:, 0] - theirs(x)[:, 0]).abs().max() > 0.1  # 1 / 1.1e-4 vs 1 / 1.41e-4
    assert GroupNormAct(64).eps == TimmGroupNormAct(64, 32).eps == 1e-5 and GroupNormAct(64, eps="vit_jax").eps == 1e-6
