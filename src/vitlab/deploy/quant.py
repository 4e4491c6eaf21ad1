"""Static int8 through PyTorch 2 export quantisation (PT2E), lowered by Inductor to oneDNN int8 kernels (CPU).

    qmodel, run = quantize_static(model, calib)   # calib: real images (N, C, H, W), prepared as for the model
    logits = run(images)                          # (B, num_classes) fp32; compiled on the first call per batch size

What happens:

1. `torch.export` captures the model as an ATen graph, batch dimension dynamic.
2. torchao's `X86InductorQuantizer` (the successor of `torch.ao.quantization.quantizer.x86_inductor_quantizer`,
   which torch 2.14 no longer ships) annotates every Linear and Conv: weights int8 per output channel
   (symmetric), activations uint8 per tensor (affine), ranges from a histogram observer run over the calibration
   images (`prepare_pt2e`, then `convert_pt2e` puts quantise / dequantise pairs around each annotated op).
3. `torch.compile` with Inductor's `freezing` turns each dequantise -> linear -> (GELU) pattern into one
   `onednn::qlinear_pointwise` call on pre-packed int8 weights (u8 x s8 -> s32 with AVX512-VNNI here) and fuses
   the fp32 elementwise work between GEMMs (residual add, LayerNorm, the next quantise) into generated C++ loops;
   where the int8 attention runs (below), each LayerNorm + quantise before an int8 GEMM is instead one call of
   vitlab's `vitlab::layer_norm_quantized` (`layer_norm_quantized_in`, `layernorm=`): one pass over each row, and
   each block's four linear layers are vitlab's int8 GEMM, `vitlab::int8_linear` (`int8_linears_in`, `gemm=`),
   with the GELU and next quantise (fc1) or the residual add (proj, fc2) in its epilogue: 1.05-1.07x the whole
   ViT-B/16 forward on a 2-core Zen 4, where oneDNN's `qlinear_pointwise` runs at 65-78% of VPDPBUSD's rate.

Attention's QK^T / softmax / AV: Inductor has no int8 batched GEMM (it lowers a quantised `matmul` to dequantise +
fp32 `bmm`), and torchao's fused int8 SDPA (`torchao.qscaled_dot_product`) has no CPU kernel in the PyPI wheel
(docs/speed.md, "Static int8"). So (`attention="auto"`, `attention_plan`):
- on CPUs with AVX512-VNNI but no AMX (Zen 4; Cascade / Ice / Cooper Lake), vitlab's own fused int8 attention
  (`vitlab.perf.int8_attention`, `sdpa_int8`): q, k per token and v per channel quantised to int8 on the fly, both
  products with VPDPBUSD, the softmax in fp32 with uint8 probabilities, reading q, k, v straight out of the qkv
  projection's output and writing (B, N, heads, head_dim) for the output projection, already as its uint8 input
  codes (`int8_attention_quantized_in`): no q/k/v split, no transpose, no quantise loop after attention.
  ViT-B/16 batch 8 on a 2-core Zen 4: 1.04-1.07x the graph with bf16 attention written out, 1.16x the one with fp32
  attention on the fp32 class (emulated); top-1 agreement with fp32 99.30% / 99.59% against 99.41% / 99.54% on two
  trained models (docs/speed.md, "int8 attention");
- with AMX tiles, the flash kernel's bf16 path (`sdpa_in`: q, k, v cast to bf16 in the graph, the casts fused by
  Inductor into the neighbouring loops);
- elsewhere, or where the int8 kernel cannot be built (a warning says so): bf16 written out on AVX512-BF16
  (`sdpa_math`: QK^T and AV as two bf16 batched GEMMs around one softmax loop Inductor fuses with the scaling), fp32
  flash on AVX2, AVX-512 without VNNI, or kernels held to a lesser ISA by `vitlab.perf.cpu.kernel_emulation`.
The LayerNorms and the residual stream stay fp32. Where bf16 is native and attention is not the flash kernel (the Zen 4
class), the int8 GEMMs also write bf16
(`outputs="auto"`, `linear_outputs_dtype`: the compiled graph runs under bf16 autocast, and Inductor's
int8-mixed-bf16 lowering gives each `qlinear_pointwise` a bf16 output), halving the bytes the loops after them
read: ViT-B/16 2% faster at batch 8 and 6% at batch 1 on a 2-core Zen 4, top-1 agreement with fp32 99.26% and 99.38%
against 99.39% and 99.40% with fp32 outputs on two trained models (docs/speed.md, "Static int8").

4. Inductor writes the compiled graph's wrapper (the code that allocates buffers and calls each kernel and oneDNN
   GEMM in turn) in C++ rather than Python (`cpp_wrapper=True`): ~150 calls per ViT-B/16 forward each lose their
   Python overhead, 3-14% faster at batch 1 and 2% at batch 8 on a 2-core Zen 4 (docs/speed.md), at the cost of a
   longer first call per batch size, as the wrapper is compiled too: ViT-B/16 on 2 cores ~21 s instead of ~14 s
   once Inductor's on-disk kernel cache holds the loops (they are built apart from the wrapper for that:
   `cpp_wrapper_build_separate`; a frozen graph is never cached whole), ~36 s the first time.

Needs torchao (`pip install 'vitlab[quant]'`) and a C++ compiler (Inductor), CPU only.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..perf.cpu import amx_kernels, bf16_kernels
from ..perf.int8_attention import (
    INT8_ATTENTION,
    INT8_ATTENTION_QUANTIZED,
    int8_attention_build_error,
    int8_attention_unavailable,
    unsupported_inputs,
)
from ..perf.int8_linear import INT8_LINEAR, int8_linear_unavailable, unsupported_weight
from ..perf.int8_linear import pack as pack_int8_linear
from ..perf.layernorm_quant import LAYER_NORM_QUANTIZED, layer_norm_quantized_unavailable
from ..perf.layernorm_quant import unsupported_inputs as layer_norm_unsupported
from ..utils.extras import require
from .calibration import calibration_tensor, input_chw  # the one reader of calibration inputs

__all__ = ["ATTENTION_DTYPES", "DEFAULT_CALIB_IMAGES", "GEMMS", "LAYERNORMS", "OUTPUT_DTYPES", "attention_plan",
           "calibration_tensor", "input_chw", "int8_linears_in", "layer_norm_quantized_in", "linear_outputs_dtype",
           "quantize_static", "sdpa_in", "sdpa_int8", "sdpa_math"]

DEFAULT_CALIB_IMAGES = 128  # calibration images used at most (the histogram observer's cost grows with them)
_CALIB_BATCH = 16  # images per calibration forward
ATTENTION_DTYPES = ("auto", "fp32", "bf16", "bf16-math", "int8")  # `quantize_static(attention=...)`
OUTPUT_DTYPES = ("auto", "fp32", "bf16")  # `quantize_static(outputs=...)`
LAYERNORMS = ("auto", "fused", "inductor")  # `quantize_static(layernorm=...)`
GEMMS = ("auto", "vitlab", "onednn")  # `quantize_static(gemm=...)`
_SDPA = torch.ops.aten.scaled_dot_product_attention.default


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide what torchao and Inductor narrate on the way: torchao's import logs a pytree deprecation through
    torch's logger, Inductor's oneDNN lowering warns about its own `torch.tensor(tensor)` copies."""
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"To copy construct from a tensor", category=UserWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torchao\.")
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchao\.")
            yield
    finally:
        pytree_log.setLevel(level)


def _torchao() -> tuple[Any, Any]:
    """(quantize_pt2e module, x86_inductor_quantizer module) from torchao; MissingExtraError naming vitlab[quant]."""
    with _quiet():
        qpt2e = require("torchao.quantization.pt2e.quantize_pt2e", "quant", "static int8 (PT2E)")
        x86 = require("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer", "quant", "static int8 (PT2E)")
    return qpt2e, x86


def attention_dtype(attention: str = "auto") -> torch.dtype:
    """The dtype static int8 runs attention in (`attention_plan`'s first element: torch.int8 for the int8 kernel)."""
    return attention_plan(attention)[0]


def attention_plan(attention: str = "auto") -> tuple[torch.dtype, str]:
    """(dtype, kernel) of static int8's attention for `quantize_static(attention=...)`: kernel "flash" (the fused
    `scaled_dot_product_attention`), "math" (`sdpa_math`) or "int8" (`sdpa_int8`, dtype torch.int8). "auto": bf16
    flash with AMX tiles; int8 where the fused int8 kernel runs (AVX512-VNNI without AMX: Zen 4, Ice / Cooper /
    Cascade Lake); else bf16 math with AVX512-BF16, fp32 flash without native bf16 (or with kernels held to a lesser
    ISA)."""
    if attention not in ATTENTION_DTYPES:
        raise ValueError(f"attention must be one of {ATTENTION_DTYPES}, got {attention!r}")
    if attention == "auto":
        if amx_kernels():
            return torch.bfloat16, "flash"
        if int8_attention_unavailable() is None:
            return torch.int8, "int8"
        return (torch.bfloat16, "math") if bf16_kernels() else (torch.float32, "flash")
    return {"fp32": (torch.float32, "flash"), "bf16": (torch.bfloat16, "flash"),
            "bf16-math": (torch.bfloat16, "math"), "int8": (torch.int8, "int8")}[attention]


def _recompiled(graph_module: torch.fx.GraphModule, changed: int) -> int:
    """After a rewrite of `graph_module`'s graph in place: check it and regenerate its code if `changed` nodes were
    rewritten; returns `changed`."""
    if changed:
        graph_module.graph.lint()
        graph_module.recompile()
    return changed


def sdpa_in(graph_module: torch.fx.GraphModule, dtype: torch.dtype) -> int:
    """Run every `scaled_dot_product_attention` of an exported graph in `dtype`: its q, k, v (and a floating-point
    mask) cast to it, its output cast back to the dtype it had. Returns how many were changed (in place)."""
    g = graph_module.graph
    changed = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        val = node.meta.get("val")
        out_dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
        q = node.args[0]
        done = isinstance(q, torch.fx.Node) and q.target is torch.ops.aten._to_copy.default and q.kwargs.get(
            "dtype") == dtype  # changed by an earlier call
        if out_dtype == dtype or done:
            continue
        args = list(node.args)
        with g.inserting_before(node):
            for i, a in enumerate(args[:4]):
                v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    args[i] = g.call_function(torch.ops.aten._to_copy.default, (a,), {"dtype": dtype})
        node.args = tuple(args)
        with g.inserting_after(node):
            back = g.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": out_dtype})
        node.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
        changed += 1
    return _recompiled(graph_module, changed)


def _plain_sdpa(node: torch.fx.Node) -> tuple[list[torch.Tensor], float, torch.dtype] | None:
    """For a `scaled_dot_product_attention` node without a mask, dropout, causality or grouped heads (ViT's): the
    example values of its q, k, v, its softmax scale and its output dtype; None for any other node."""
    if node.op != "call_function" or node.target is not _SDPA:
        return None
    q, k, v, *rest = node.args
    kw = dict(node.kwargs)
    plain = (all(r is None or r == d for r, d in zip(rest, (None, 0.0, False), strict=False))
             and not kw.get("enable_gqa", False) and set(kw) <= {"scale", "enable_gqa"})
    vals: list[torch.Tensor] = [t for a in (q, k, v) if isinstance(a, torch.fx.Node)
                                and isinstance(t := a.meta.get("val"), torch.Tensor) and t.is_floating_point()]
    if not plain or len(vals) != 3:
        return None
    given = kw.get("scale")
    scale = float(vals[0].shape[-1]) ** -0.5 if given is None else float(given)  # type: ignore[arg-type]
    out = node.meta.get("val")
    return vals, scale, out.dtype if isinstance(out, torch.Tensor) else torch.float32


def _rewrite_sdpa(graph_module: torch.fx.GraphModule, build: Callable[..., Any]) -> int:
    """Replace each plain attention node (`_plain_sdpa`) for which `build(graph, q, k, v, vals, scale, out_dtype)`
    returns a node (added before it) by that node; None leaves it. Returns how many were replaced (in place)."""
    g = graph_module.graph
    changed = 0
    for node in list(g.nodes):
        plain = _plain_sdpa(node)
        if plain is None:
            continue
        vals, scale, out_dtype = plain
        with g.inserting_before(node):
            result = build(g, *node.args[:3], vals, scale, out_dtype)
        if result is None:
            continue
        node.replace_all_uses_with(result)
        g.erase_node(node)
        changed += 1
    return _recompiled(graph_module, changed)


def sdpa_math(graph_module: torch.fx.GraphModule, dtype: torch.dtype) -> int:
    """Write out every `scaled_dot_product_attention` of an exported graph as softmax(q k^T * scale) v in `dtype`:
    q, k, v cast to it, two batched matmuls and one softmax (computed in fp32 by Inductor's loop, stored in
    `dtype`), the output cast back to the dtype it had. Only attention without a mask, dropout, causality or grouped
    heads is rewritten (ViT's); any other is left as it is. Returns how many were rewritten (in place)."""
    def build(g: torch.fx.Graph, q: Any, k: Any, v: Any, vals: list[torch.Tensor], scale: float,
              out_dtype: torch.dtype) -> Any:
        def cast(a: Any, dt: torch.dtype = dtype) -> Any:
            return g.call_function(torch.ops.aten._to_copy.default, (a,), {"dtype": dt})

        qq = g.call_function(torch.ops.aten.mul.Tensor, (cast(q), scale))
        kt = g.call_function(torch.ops.aten.transpose.int, (cast(k), -2, -1))
        scores = g.call_function(torch.ops.aten.matmul.default, (qq, kt))  # (B, heads, N, N)
        probs = g.call_function(torch.ops.aten._softmax.default, (scores, -1, False))
        return cast(g.call_function(torch.ops.aten.matmul.default, (probs, cast(v))), out_dtype)

    return _rewrite_sdpa(graph_module, build)


def sdpa_int8(graph_module: torch.fx.GraphModule) -> int:
    """Replace every `scaled_dot_product_attention` of an exported graph by vitlab's fused int8 attention
    (`vitlab.perf.int8_attention`): q, k, v passed as they are (fp32 or bf16, strided views of the qkv projection),
    the output in their dtype, cast back to the dtype the graph had. Only attention without a mask, dropout,
    causality or grouped heads, on inputs the kernel takes (`unsupported_inputs`: one 4-D shape, a head dimension
    that is a multiple of 16 up to 256), is rewritten (ViT's); any other is left as it is. Returns how many were
    rewritten (in place)."""
    def build(g: torch.fx.Graph, q: Any, k: Any, v: Any, vals: list[torch.Tensor], scale: float,
              out_dtype: torch.dtype) -> Any:
        if unsupported_inputs(*vals):  # the kernel's own rule, on the graph's example values
            return None
        attn = g.call_function(INT8_ATTENTION, (q, k, v, scale))
        return g.call_function(torch.ops.aten._to_copy.default, (attn,), {"dtype": out_dtype})

    return _rewrite_sdpa(graph_module, build)


_LAYOUT = (torch.ops.aten.transpose.int, torch.ops.aten.reshape.default, torch.ops.aten.view.default,
           torch.ops.aten.permute.default)


def int8_attention_quantized_in(graph_module: torch.fx.GraphModule) -> int:
    """Fold the quantise after each int8 attention (`sdpa_int8`) into the kernel: where `int8_attention`'s output
    reaches a uint8 [0, 255] `quantize_per_tensor` (the output projection's input) through only a dtype cast and
    layout ops (transpose, reshape), each with no other user, the kernel writes those codes itself
    (`int8_attention_quantized`) and the layout ops act on them. The generated loop that read the attention's output
    to quantise it is gone, and the kernel writes a byte per value. Returns how many were folded (in place)."""
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default  # registered by torchao's PT2E
    g = graph_module.graph
    changed = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not INT8_ATTENTION:
            continue
        chain, cur = [], node
        while len(cur.users) == 1:
            cur = next(iter(cur.users))
            cast = cur.target is torch.ops.aten._to_copy.default and set(cur.kwargs) <= {"dtype"}
            if cast or cur.target in _LAYOUT:
                chain.append(cur)
                continue
            break
        if not (cur.target is quantize and len(cur.args) == 6 and not cur.kwargs
                and tuple(cur.args[3:]) == (0, 255, torch.uint8) and len(chain) >= 1):
            continue
        _, scale, zero_point = cur.args[:3]
        if not (isinstance(scale, float) and isinstance(zero_point, int)):  # static (calibrated) quantisation only
            continue
        with g.inserting_before(cur):
            out = g.call_function(INT8_ATTENTION_QUANTIZED, (*node.args, scale, zero_point))
            for link in chain:
                if link.target in _LAYOUT:
                    out = g.call_function(link.target, (out, *link.args[1:]), dict(link.kwargs))
        cur.replace_all_uses_with(out)
        for dead in [cur, *reversed(chain), node]:
            g.erase_node(dead)
        changed += 1
    return _recompiled(graph_module, changed)


def layer_norm_quantized_in(graph_module: torch.fx.GraphModule) -> int:
    """Fuse each LayerNorm whose only reader is a static uint8 [0, 255] `quantize_per_tensor` (the input of an int8
    linear layer: before qkv and before fc1 in every block) into one `vitlab::layer_norm_quantized` call
    (`vitlab.perf.layernorm_quant`): one pass over each row where Inductor's loop makes three. Only LayerNorms over
    the last dimension with fp32 weight and bias, on fp32 or bf16 inputs, are fused; any other is left as it is.
    Returns how many were fused (in place)."""
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default  # registered by torchao's PT2E
    g = graph_module.graph
    changed = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.layer_norm.default or len(node.users) != 1:
            continue
        given = tuple(node.args[:5])
        x, shape, weight, bias, eps = given + (None, None, None, None, 1e-5)[len(given):]  # aten's defaults
        weight, bias, eps = (node.kwargs.get(k, v) for k, v in (("weight", weight), ("bias", bias), ("eps", eps)))
        q = next(iter(node.users))
        if not (q.target is quantize and len(q.args) == 6 and not q.kwargs and q.args[0] is node
                and tuple(q.args[3:]) == (0, 255, torch.uint8)
                and isinstance(q.args[1], float) and isinstance(q.args[2], int) and isinstance(eps, float)):
            continue
        xv, wv, bv = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (x, weight, bias))
        if not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor) and isinstance(bv, torch.Tensor)) \
                or layer_norm_unsupported(xv, wv, bv) or list(shape) != [xv.shape[-1]]:
            continue
        with g.inserting_before(q):
            fused = g.call_function(LAYER_NORM_QUANTIZED, (x, weight, bias, eps, q.args[1], q.args[2]))
        q.replace_all_uses_with(fused)
        g.erase_node(q)
        g.erase_node(node)
        changed += 1
    return _recompiled(graph_module, changed)


def _static_uint8(node: Any, target: Any) -> bool:
    """Whether `node` is `target` (quantize_per_tensor / dequantize_per_tensor) with a calibrated (constant) scale and
    zero point over uint8 [0, 255] codes."""
    return (isinstance(node, torch.fx.Node) and node.target is target and len(node.args) == 6 and not node.kwargs
            and isinstance(node.args[1], float) and isinstance(node.args[2], int)
            and tuple(node.args[3:]) == (0, 255, torch.uint8))


def _attr(graph_module: torch.fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The tensor a get_attr node reads, or None for any other node."""
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return None
    obj: Any = graph_module
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) else None


def _identity(node: torch.fx.Node) -> bool:
    """A dropout that does nothing at inference (p = 0 or not training), as export leaves them in the graph."""
    if node.target is not torch.ops.aten.dropout.default:
        return False
    p, train = (*node.args[1:3], None, None)[:2]
    return bool(p == 0) or train is False


def int8_linears_in(graph_module: torch.fx.GraphModule, out_dtype: torch.dtype) -> int:
    """Put vitlab's int8 GEMM (`vitlab::int8_linear`, `vitlab.perf.int8_linear`) in place of each static int8 linear
    layer it takes: `linear(dequantize(uint8 codes), dequantize_per_channel(int8 weight, symmetric), bias)` with out
    features a multiple of 64, together with what follows it alone (inference dropouts skipped): the erf GELU and/or
    the uint8 quantise of the next layer's input (fc1), or the residual add (proj, fc2: fp32 out), else the output in
    `out_dtype` (qkv). The weights are packed now, as buffers of `graph_module` (the int8 originals it no longer reads
    are dropped). Others (the head's 1000 classes, the patch-embedding conv) stay with oneDNN. Returns how many were
    put in (in place)."""
    dq_t = torch.ops.quantized_decomposed.dequantize_per_tensor.default  # registered by torchao's PT2E
    dq_c = torch.ops.quantized_decomposed.dequantize_per_channel.default
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    g = graph_module.graph
    changed = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default or node.kwargs:
            continue
        x, wdq, bias = (*node.args, None)[:3]
        if not (_static_uint8(x, dq_t) and isinstance(wdq, torch.fx.Node) and wdq.target is dq_c
                and len(wdq.args) == 7 and tuple(wdq.args[3:]) == (0, -128, 127, torch.int8) and not wdq.kwargs):
            continue
        w, w_scale, w_zp = (_attr(graph_module, a) for a in wdq.args[:3])
        b = _attr(graph_module, bias) if bias is not None else None
        if w is None or w_scale is None or w_zp is None or (bias is not None and b is None) or unsupported_weight(w) \
                or bool(w_zp.any()):
            continue
        chain, cur = [node], node  # the linear and what it alone feeds, in order
        gelu = False
        while len(cur.users) == 1:
            nxt = next(iter(cur.users))
            if _identity(nxt) or (not gelu and nxt.target is torch.ops.aten.gelu.default and len(nxt.args) == 1
                                  and nxt.kwargs.get("approximate", "none") == "none"):
                gelu = gelu or nxt.target is torch.ops.aten.gelu.default
                chain.append(nxt)
                cur = nxt
                continue
            break
        users = list(cur.users)
        out_scale, out_zp, residual, dtype = 1.0, 0, None, out_dtype
        end = cur
        if len(users) == 1 and _static_uint8(users[0], quantize) and users[0].args[0] is cur:
            end = users[0]
            out_scale, out_zp, dtype = float(end.args[1]), int(end.args[2]), torch.uint8
        elif (len(users) == 1 and users[0].target is torch.ops.aten.add.Tensor and len(users[0].args) == 2
              and not users[0].kwargs and not gelu):
            end = users[0]
            other = end.args[1] if end.args[0] is cur else end.args[0]
            val = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
            ours = node.meta.get("val")
            if other is cur or not (isinstance(val, torch.Tensor) and isinstance(ours, torch.Tensor)
                                    and val.dtype == torch.float32 and val.shape == ours.shape):
                end = cur
            else:
                residual, dtype = other, torch.float32
        if end is not cur:
            chain.append(end)
        packed = pack_int8_linear(w, w_scale.float(), float(x.args[1]), int(x.args[2]), b)
        index = next(i for i in range(changed, 1 << 30) if not hasattr(graph_module, f"_int8_linear{i}_weight"))
        names = [f"_int8_linear{index}_{part}" for part in packed._fields]  # new buffers (a second pass adds more)
        for name, t in zip(names, packed, strict=True):
            graph_module.register_buffer(name, t)
        with g.inserting_before(end):
            consts = [g.get_attr(n) for n in names]
            fused = g.call_function(INT8_LINEAR, (x.args[0], *consts, residual, gelu, dtype, out_scale, out_zp))
        val = end.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == dtype:  # what it computes, as the node it stands for: a
            fused.meta["val"] = val  # later layer's residual add (fc2's, reading proj's sum) is checked by it
        end.replace_all_uses_with(fused)
        for dead in reversed(chain):
            g.erase_node(dead)
        for dead in (x, wdq, *wdq.args[:3], bias):  # what only the linear read (its weight's int8 original too)
            if isinstance(dead, torch.fx.Node) and not dead.users:
                if dead.op == "get_attr" and not any(n.op == "get_attr" and n.target == dead.target and n is not dead
                                                     for n in g.nodes):
                    _drop_attr(graph_module, str(dead.target))
                g.erase_node(dead)
        changed += 1
    return _recompiled(graph_module, changed)


def _drop_attr(graph_module: torch.fx.GraphModule, target: str) -> None:
    """Delete the (possibly dotted) attribute `target` of `graph_module`: a constant no node reads any more."""
    owner_path, _, name = target.rpartition(".")
    owner: Any = graph_module
    for part in owner_path.split(".") if owner_path else []:
        owner = getattr(owner, part)
    delattr(owner, name)


def linear_outputs_dtype(outputs: str = "auto", attention: str = "auto") -> torch.dtype:
    """The dtype static int8's linear layers write for `quantize_static(outputs=..., attention=...)`: "fp32", "bf16",
    or "auto": bf16 where attention is written out in bf16, or is int8 on a CPU with native bf16
    (`attention_plan(attention)`; with attention "auto", AVX512-BF16 without AMX, the Zen 4 / Cooper Lake class,
    where it was measured faster), fp32 elsewhere."""
    if outputs not in OUTPUT_DTYPES:
        raise ValueError(f"outputs must be one of {OUTPUT_DTYPES}, got {outputs!r}")
    if outputs == "auto":
        dtype, kernel = attention_plan(attention)
        if kernel == "int8":  # bf16 where bf16 is native: the int8 attention reads and writes either
            return torch.bfloat16 if bf16_kernels() else torch.float32
        return torch.bfloat16 if (dtype, kernel) == (torch.bfloat16, "math") else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[outputs]


def quantize_static(model: nn.Module, calib: Any, *, calib_images: int = DEFAULT_CALIB_IMAGES,
                    attention: str = "auto", outputs: str = "auto", layernorm: str = "auto", gemm: str = "auto",
                    cpp_wrapper: bool = True) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """Static int8 copy of `model`: PT2E quantisation calibrated on `calib`, compiled by Inductor with freezing.

    Args:
        model: An fp32 classifier on the CPU taking (B, C, H, W) images (left unmodified).
        calib: Real calibration images (see `vitlab.deploy.calibration.calibration_tensor`), prepared as for the
            model.
        calib_images: Use at most this many of them.
        attention: How attention's QK^T / softmax / AV run: "fp32" or "bf16" (the flash kernel in that dtype),
            "bf16-math" (written out in bf16, `sdpa_math`), "int8" (vitlab's fused int8 kernel, `sdpa_int8`; needs
            AVX512-VNNI), or "auto" (`attention_plan`: bf16 flash with AMX, int8 with AVX512-VNNI otherwise, bf16
            math with AVX512-BF16 alone, fp32 flash elsewhere; see the module docstring).
        outputs: The dtype the int8 GEMMs write their dequantised outputs in: "fp32", "bf16" (the compiled graph
            runs under bf16 autocast: Inductor's int8-mixed-bf16 lowering makes each `qlinear_pointwise` write bf16,
            half the bytes for the loops that read them: the q/k/v split, GELU, the residual adds; the residual stream
            and the LayerNorms stay fp32, as autocast adds a bf16 output to an fp32 residual in fp32), or "auto"
            (`linear_outputs_dtype`: bf16 where bf16 is native and attention is written out or int8, fp32
            elsewhere).
        layernorm: How each LayerNorm before an int8 linear layer and the quantise of its output run: "fused"
            (`vitlab::layer_norm_quantized`, one pass; needs AVX-512), "inductor" (Inductor's generated loop), or
            "auto" (fused where the int8 attention kernel runs, the class it was measured on: AVX512-VNNI without
            AMX; Inductor's loop elsewhere).
        gemm: Whose int8 GEMMs run the linear layers: "vitlab" (`vitlab::int8_linear`, `int8_linears_in`: each with
            its GELU / next quantise / residual add; needs AVX512-VNNI), "onednn" (Inductor's `qlinear_pointwise`),
            or "auto" (vitlab's where the int8 attention kernel runs, the class it was measured on: AVX512-VNNI
            without AMX; oneDNN elsewhere, AMX's tiles among them).
        cpp_wrapper: Have Inductor write the graph's wrapper in C++ (faster calls, slower first call per batch
            size); False keeps its Python wrapper.

    Returns:
        (the quantised graph module, a function images -> fp32 logits that runs it compiled, without autograd).
        The first call for each batch size compiles (tens of seconds for ViT-B/16 on 2 cores).

    Raises:
        MissingExtraError: torchao is not installed (`vitlab[quant]`).
        RuntimeError: The model is not on the CPU; attention="int8" where the int8 kernel cannot run or be built.
        ValueError: Bad calibration images.
    """
    ref = next(model.parameters(), None)
    if ref is not None and ref.device.type != "cpu":
        raise RuntimeError(f"static int8 runs on the CPU only (the model is on {ref.device}); move it with .cpu()")
    if ref is not None and ref.dtype != torch.float32:
        raise ValueError(f"static int8 quantises an fp32 model; this one is {ref.dtype}")
    if calib_images < 1:
        raise ValueError(f"calib_images must be >= 1, got {calib_images}")
    if layernorm not in LAYERNORMS:
        raise ValueError(f"layernorm must be one of {LAYERNORMS}, got {layernorm!r}")
    if layernorm == "fused" and (reason := layer_norm_quantized_unavailable()):
        raise RuntimeError(f"layernorm='fused': {reason}")
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    if gemm == "vitlab" and (reason := int8_linear_unavailable()):
        raise RuntimeError(f"gemm='vitlab': {reason}")
    attn_dtype, attn_kernel = attention_plan(attention)
    if attn_kernel == "int8":  # before calibrating: refuse now, not after minutes
        reason = int8_attention_unavailable() or int8_attention_build_error()
        if reason and attention == "int8":
            raise RuntimeError(f"attention='int8': {reason}")
        if reason:  # "auto": what this host ran before the int8 kernel existed
            warnings.warn(f"static int8: attention not in int8 ({reason})", RuntimeWarning, stacklevel=2)
            attention = "bf16-math" if bf16_kernels() else "fp32"
            attn_dtype, attn_kernel = attention_plan(attention)
    out_dtype = linear_outputs_dtype(outputs, attention)
    images = calibration_tensor(calib, input_chw(model), calib_images)  # (n, C, H, W)
    qpt2e, x86 = _torchao()
    model = model.eval()
    example = images[:2] if len(images) >= 2 else images.expand(2, -1, -1, -1)  # (2, C, H, W): batch is not 1
    batch = torch.export.Dim("batch", min=1, max=4096)
    with _quiet(), torch.no_grad():
        graph = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
        quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
        prepared = qpt2e.prepare_pt2e(graph, quantizer)
        for chunk in images.split(_CALIB_BATCH):
            prepared(chunk)
        qmodel = qpt2e.convert_pt2e(prepared)
        pt2e = require("torchao.quantization.pt2e", "quant", "static int8 (PT2E)")
        pt2e.allow_exported_model_train_eval(qmodel)  # .eval() on it (OptimizedModel does) is then allowed
    ran = str(attn_dtype).removeprefix("torch.")
    if attn_kernel == "int8":
        attn_dtype = out_dtype  # any attention it cannot take (masks, odd head sizes) runs in the linears' dtype
        ran = str(out_dtype).removeprefix("torch.")
        if sdpa_int8(qmodel):
            qmodel.meta["attention_kernel"] = "int8"
            ran = "int8"
            int8_attention_quantized_in(qmodel)
    fuse_ln = layernorm == "fused" or (layernorm == "auto" and qmodel.meta.get("attention_kernel") == "int8"
                                       and layer_norm_quantized_unavailable() is None)
    if fuse_ln and layer_norm_quantized_in(qmodel):  # before qkv and fc1: one pass over each row
        qmodel.meta["layernorm_kernel"] = "layer_norm_quantized"
    ours = gemm == "vitlab" or (gemm == "auto" and qmodel.meta.get("attention_kernel") == "int8"
                                and int8_linear_unavailable() is None)
    if ours and int8_linears_in(qmodel, out_dtype):  # qkv, proj, fc1, fc2: each with its epilogue
        qmodel.meta["gemm_kernel"] = "int8_linear"
    if attn_kernel == "math" and sdpa_math(qmodel, attn_dtype):
        qmodel.meta["attention_kernel"] = "math"
    sdpa_in(qmodel, attn_dtype)  # any attention left to the flash kernel
    qmodel.meta["attention_dtype"] = ran  # what ran, for reports
    qmodel.meta["outputs_dtype"] = str(out_dtype).removeprefix("torch.")
    compiled = torch.compile(qmodel, dynamic=False)  # one specialised graph per batch size
    mixed = out_dtype == torch.bfloat16
    built: set[tuple[Any, ...]] = set()  # the input shapes and strides compiled for

    def run(x: torch.Tensor) -> torch.Tensor:
        # No autograd: with grad enabled Inductor would compile a training graph, where freezing does not apply
        # (no packed int8 GEMMs: ViT-B/16 twice as slow).
        x = x.float()
        key = (tuple(x.shape), x.stride())
        if key in built:  # compiled: no config to set, nothing to hide (those two cost ~180 us a call)
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=mixed):
                return compiled(x).float()  # type: ignore[no-any-return]
        # freezing: weights become constants, packed once for oneDNN's int8 kernels. Passed as a config patch
        # around the compiling call, not as torch.compile(options=...), which fails to fake-run
        # onednn.qconv_prepack.
        with (_quiet(), torch.no_grad(), torch._inductor.config.patch(freezing=True, cpp_wrapper=cpp_wrapper,
                                                                     cpp_wrapper_build_separate=cpp_wrapper),
              torch.autocast("cpu", torch.bfloat16, enabled=mixed)):
            out = compiled(x).float()
        built.add(key)
        return out  # type: ignore[no-any-return]

    return qmodel, run

