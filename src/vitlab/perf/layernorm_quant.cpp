// LayerNorm over the last dimension, quantised per tensor to uint8 in the same pass: the input of a static int8 linear
// layer (`vitlab::layer_norm_quantized`, for x86 CPUs with AVX-512).
//
// Compiled at run time by Inductor's C++ builder with torch's headers (vitlab/perf/native.py loads it) and registered
// as the op's CPU kernel through torch's stable C ABI (the schema is defined in layernorm_quant.py). Per row of D:
//   mean = sum(x) / D, var = sum((x - mean)^2) / D (two-step, as Inductor computes LayerNorm for rows up to 1024),
//   y = (x - mean) / sqrt(var + eps) * weight + bias,
//   code = clamp(round_half_even(y * (1 / out_scale)) + zero_point, 0, 255)   (quantize_per_tensor's; NaN gives 0)
// The row is read from memory once (the next rows prefetched) and stays in L1 for the other two passes; Inductor's
// loop for the same graph reads it three times with a barrier between passes.
#include <immintrin.h>
#include <omp.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdint>

#define VITLAB_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

namespace {

VITLAB_TARGET inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
VITLAB_TARGET inline __m512 load16(const uint16_t* p, __mmask16 m) {  // bf16 -> fp32: the 16 bits on top
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

inline __mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

constexpr int64_t kAhead = 2;  // rows prefetched ahead

template <typename T>
VITLAB_TARGET void rows(const T* x, int64_t R, int64_t D, const float* w, const float* b, float eps, float inv,
                        float zp, uint8_t* out, int threads) {
  const float invD = 1.0f / float(D);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * D;
    if (r + kAhead < R)
      for (int64_t o = 0; o < D * int64_t(sizeof(T)); o += 64) __builtin_prefetch((const char*)(xr + kAhead * D) + o);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
      s0 = _mm512_add_ps(s0, load16(xr + d, 0xffff));
      s1 = _mm512_add_ps(s1, load16(xr + d + 16, 0xffff));
    }
    for (; d < D; d += 16) s0 = _mm512_add_ps(s0, load16(xr + d, lanes(D - d)));
    const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * invD);
    s0 = s1 = _mm512_setzero_ps();
    for (d = 0; d + 32 <= D; d += 32) {
      const __m512 a = _mm512_sub_ps(load16(xr + d, 0xffff), mean), c = _mm512_sub_ps(load16(xr + d + 16, 0xffff), mean);
      s0 = _mm512_fmadd_ps(a, a, s0);
      s1 = _mm512_fmadd_ps(c, c, s1);
    }
    for (; d < D; d += 16) {
      const __mmask16 m = lanes(D - d);
      const __m512 a = _mm512_maskz_sub_ps(m, load16(xr + d, m), mean);
      s0 = _mm512_fmadd_ps(a, a, s0);
    }
    const float var = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * invD;
    const __m512 rstd = _mm512_set1_ps(1.0f / std::sqrt(var + eps));  // NaN for a row with a NaN or an inf
    const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp), hi = _mm512_set1_ps(255.0f);
    for (d = 0; d < D; d += 16) {
      const __mmask16 m = lanes(D - d);
      __m512 y = _mm512_mul_ps(_mm512_sub_ps(load16(xr + d, m), mean), rstd);
      y = _mm512_add_ps(_mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, w + d)), _mm512_maskz_loadu_ps(m, b + d));
      y = _mm512_add_ps(_mm512_roundscale_ps(_mm512_mul_ps(y, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                        vzp);
      y = _mm512_min_ps(_mm512_max_ps(y, _mm512_setzero_ps()), hi);  // max(NaN, 0) is 0
      _mm_mask_storeu_epi8(out + r * D + d, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(y)));
    }
  }
}

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor layer_norm_quantized(Tensor x, Tensor weight, Tensor bias, double eps, double out_scale, int64_t zero_point) {
  STD_TORCH_CHECK(vitlab_cpu_avx512(), "layer_norm_quantized needs AVX-512 (avx512f/bw/dq/vl); this CPU lacks it");
  STD_TORCH_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) >= 1, "layer_norm_quantized needs a last dimension");
  const int64_t D = x.size(x.dim() - 1);
  const ScalarType dt = x.scalar_type();
  STD_TORCH_CHECK(dt == ScalarType::Float || dt == ScalarType::BFloat16, "layer_norm_quantized takes fp32 or bf16 x");
  STD_TORCH_CHECK(weight.dim() == 1 && bias.dim() == 1 && weight.size(0) == D && bias.size(0) == D &&
                      weight.scalar_type() == ScalarType::Float && bias.scalar_type() == ScalarType::Float,
                  "layer_norm_quantized needs fp32 weight and bias of x's last dimension (", D, ")");
  STD_TORCH_CHECK(out_scale > 0.0 && out_scale < INFINITY && zero_point >= 0 && zero_point <= 255 && eps >= 0.0,
                  "layer_norm_quantized writes uint8 codes: needs a positive, finite scale, a zero point in "
                  "[0, 255] and eps >= 0");
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  if (!weight.is_contiguous()) weight = torch::stable::contiguous(weight);
  if (!bias.is_contiguous()) bias = torch::stable::contiguous(bias);
  Tensor out = torch::stable::new_empty(x, x.sizes(), ScalarType::Byte);
  const int64_t R = x.numel() / D;
  if (R == 0) return out;
  const float* w = static_cast<const float*>(weight.data_ptr());
  const float* b = static_cast<const float*>(bias.data_ptr());
  uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
  const int threads = int(torch::stable::get_num_threads());
  if (dt == ScalarType::Float)
    rows(static_cast<const float*>(x.data_ptr()), R, D, w, b, float(eps), float(1.0 / out_scale), float(zero_point),
         o, threads);
  else
    rows(static_cast<const uint16_t*>(x.data_ptr()), R, D, w, b, float(eps), float(1.0 / out_scale),
         float(zero_point), o, threads);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(vitlab, CPU, m) { m.impl("layer_norm_quantized", TORCH_BOX(&layer_norm_quantized)); }
