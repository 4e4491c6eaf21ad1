"""The peers `vitlab bench` runs beside our ViT: timm, transformers, torchvision, and the deployment runtimes
ONNX Runtime and OpenVINO (fp32, OpenVINO bf16, and each runtime's post-training int8).

Each builder takes our model and returns the peer's implementation with the same shape and our weights (renamed
where the peer's names differ), so that the benchmark compares implementations, not models. Optional
dependencies are imported inside each builder: a missing one raises ImportError, which the benchmark reports as a
skipped peer; a shape the peer cannot express raises ValueError. The runtimes are built by `vitlab.deploy` from
our model (`build_runtime`): they take fp32 images whatever they compute in. ONNX Runtime's int8 comes both ways,
static (QDQ, calibrated) and dynamic (activations quantised per call): which is faster depends on the CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from ..deploy.runtimes import to_onnxruntime, to_openvino
from ..models.vit import VisionTransformer
from ..weights import torchvision as tvw

# runtime peer -> {our dtype pass it runs in: its compute dtype}; int8 peers run beside our fp32 (and our int8 mode)
RUNTIME_PEERS: dict[str, dict[str, str]] = {
    "onnxruntime": {"fp32": "fp32"},
    "onnxruntime-int8": {"fp32": "int8"},
    "onnxruntime-int8-dynamic": {"fp32": "int8"},  # no calibration; ONNX Runtime's best int8 on some CPUs
    "openvino": {"fp32": "fp32", "bf16": "bf16"},
    "openvino-int8": {"fp32": "int8"},
}
PEERS = ("timm", "transformers", "torchvision", *RUNTIME_PEERS)


class _Logits(nn.Module):
    """transformers returns an output object; this returns its logits tensor like the others."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def build_timm(model: VisionTransformer) -> nn.Module:
    """timm's VisionTransformer with our shape and weights (same parameter names: loaded as is)."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    c = model.cfg
    peer = TimmViT(
        img_size=c.img_hw, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
        global_pool="token" if c.pool == "token" else "avg", embed_dim=c.embed_dim, depth=c.depth,
        num_heads=c.num_heads, mlp_ratio=c.mlp_dim / c.embed_dim, qkv_bias=c.qkv_bias, class_token=c.class_token,
        no_embed_class=False, pos_embed="learn" if c.pos_embed == "learned" else "none",
        norm_layer=functools.partial(nn.LayerNorm, eps=c.layer_norm_eps),
    )
    peer.load_state_dict(model.state_dict(), strict=True)
    return peer


def build_torchvision(model: VisionTransformer) -> nn.Module:
    """torchvision's VisionTransformer (square images, class token, learned position embeddings only)."""
    from torchvision.models.vision_transformer import VisionTransformer as TvViT

    c = model.cfg
    h, w = c.img_hw
    if h != w or c.pool != "token" or c.pos_embed != "learned" or c.layer_norm_eps != 1e-6 or not c.qkv_bias:
        raise ValueError("torchvision's ViT needs a square image, pool='token', learned pos-emb, eps 1e-6, qkv bias")
    peer = TvViT(image_size=h, patch_size=c.patch_size, num_layers=c.depth, num_heads=c.num_heads,
                 hidden_dim=c.embed_dim, mlp_dim=c.mlp_dim, num_classes=c.num_classes)
    if c.in_chans != 3:
        peer.conv_proj = nn.Conv2d(c.in_chans, c.embed_dim, c.patch_size, stride=c.patch_size)
    names = {k: k for k in peer.state_dict()}
    ours_to_tv = {ours: tv for ours, tv in tvw.to_ours(names, "torchvision").items()}  # renaming only
    ours = model.state_dict()
    peer.load_state_dict({tv: ours[k] for k, tv in ours_to_tv.items()}, strict=True)
    return peer


def build_transformers(model: VisionTransformer) -> nn.Module:
    """transformers' ViTForImageClassification (SDPA attention) with our weights; q, k, v split from qkv."""
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    c = model.cfg
    h, w = c.img_hw
    if h != w or c.pool != "token" or c.pos_embed != "learned":
        raise ValueError("transformers' ViT needs a square image, pool='token' and learned pos-emb")
    hf_cfg = HFConfig(
        hidden_size=c.embed_dim, num_hidden_layers=c.depth, num_attention_heads=c.num_heads,
        intermediate_size=c.mlp_dim, hidden_act="gelu", image_size=h, patch_size=c.patch_size,
        num_channels=c.in_chans, layer_norm_eps=c.layer_norm_eps, qkv_bias=c.qkv_bias, num_labels=c.num_classes,
        attn_implementation="sdpa",
    )  # type: ignore[call-arg]  # num_labels, attn_implementation: PretrainedConfig's untyped **kwargs
    peer = ViTForImageClassification(hf_cfg)
    ours = model.state_dict()
    keys = set(peer.state_dict())
    state = {
        "vit.embeddings.cls_token": ours["cls_token"],
        "vit.embeddings.position_embeddings": ours["pos_embed"],
        "vit.embeddings.patch_embeddings.projection.weight": ours["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": ours["patch_embed.proj.bias"],
        "vit.layernorm.weight": ours["norm.weight"], "vit.layernorm.bias": ours["norm.bias"],
        "classifier.weight": ours["head.weight"], "classifier.bias": ours["head.bias"],
    }
    old = "vit.encoder.layer.0.attention.attention.query.weight" in keys  # transformers < 5 module names
    names = ({"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
              "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"} if old else
             {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.o_proj",
              "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"})
    qkv_names = (("attention.attention.query", "attention.attention.key", "attention.attention.value") if old
                 else ("attention.q_proj", "attention.k_proj", "attention.v_proj"))
    for i in range(c.depth):
        layer = f"vit.encoder.layer.{i}" if old else f"vit.layers.{i}"
        for kind in ("weight", "bias"):
            for a, b in names.items():
                state[f"{layer}.{b}.{kind}"] = ours[f"blocks.{i}.{a}.{kind}"]
            qkv = ours.get(f"blocks.{i}.attn.qkv.{kind}")
            if qkv is not None:
                for name, part in zip(qkv_names, qkv.chunk(3, dim=0)):  # rows: q, then k, then v
                    state[f"{layer}.{name}.{kind}"] = part
    peer.load_state_dict(state, strict=True)
    return _Logits(peer)


class OnnxRuntime:
    """Our model exported to ONNX (fp32), run by onnxruntime's CPU provider with the same thread count."""

    def __init__(self, model: VisionTransformer, threads: int):
        example = torch.zeros(1, model.cfg.in_chans, *model.cfg.img_hw)
        self.module = to_onnxruntime(model.float(), example, threads=threads)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def build_runtime(name: str, model: VisionTransformer, dname: str, threads: int,
                  calib: torch.Tensor | None = None) -> tuple[nn.Module, str] | None:
    """The runtime peer `name` for our `dname` pass: (module taking fp32 images, its compute dtype), or None when
    it has no candidate in that dtype. int8 peers are calibrated on `calib` ((N, C, H, W) images).

    Raises:
        ImportError: The runtime is not installed (MissingExtraError names the extra).
        ValueError: A precision the CPU lacks (OpenVINO bf16) or a model the runtime cannot express.
    """
    cdt = RUNTIME_PEERS[name].get(dname)
    if cdt is None:
        return None
    model = model.float().eval()
    example = torch.zeros(1, model.cfg.in_chans, *model.cfg.img_hw)
    int8 = cdt == "int8"
    if name.startswith("openvino"):
        fn = to_openvino(model, example, int8=int8, calib=calib, precision="fp32" if int8 else cdt, threads=threads)
    elif name.endswith("-dynamic"):
        fn = to_onnxruntime(model, example, int8=True, method="dynamic", threads=threads)
    else:
        fn = to_onnxruntime(model, example, int8=int8, calib=calib, threads=threads)
    return fn, cdt


BUILDERS: dict[str, Callable[[VisionTransformer], nn.Module]] = {
    "timm": build_timm, "transformers": build_transformers, "torchvision": build_torchvision,
}
