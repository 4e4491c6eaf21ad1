// LayerNorm over each row's last dimension, then per-tensor affine quantisation to uint8: what static int8 runs
// before every int8 GEMM that reads a LayerNorm (vitlab/perf/norm_quant.py).
//
// Compiled at run time by Inductor's C++ builder (vitlab/perf/cpp_kernel.py), C ABI, called through ctypes. One
// row at a time, in L1: mean, then the mean of squared deviations (two passes, as Inductor's own LayerNorm loop),
// then y = (x - mean) * rstd * w + b and q = clamp(round(y / scale) + zero_point, qmin, qmax), each product rounded
// on its own (no FMA contraction: the builder compiles with -ffp-contract=off), round half to even. The loops are
// vectorised by `omp simd` for whatever vector ISA the builder targets (AVX2, AVX-512).
// A row holding NaN or inf quantises to qmin where its values are NaN, as a NaN never reaches an integer.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

// Inductor's builder passes -fno-tree-loop-vectorize (its own loops are vectorised by hand); these are not.
#pragma GCC optimize("tree-loop-vectorize")

namespace {

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) {  // bf16: the top 16 bits of an fp32
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
void run(const T* x, const float* w, const float* b, uint8_t* out, int64_t rows, int64_t C, float eps,
         float inv_scale, float zero_point, float qmin, float qmax, int threads) {
  const float n = float(C);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    uint8_t* o = out + r * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += to_float(xr[c]);
    const float mean = sum / n;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) {
      const float d = to_float(xr[c]) - mean;
      sq += d * d;
    }
    const float rstd = 1.0f / std::sqrt(sq / n + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float y = (to_float(xr[c]) - mean) * rstd * w[c] + b[c];
      float q = std::rint(y * inv_scale) + zero_point;  // rint: the default rounding mode, half to even
      q = q > qmin ? q : qmin;  // NaN -> qmin (std::fmax would keep GCC from vectorising the loop)
      q = q < qmax ? q : qmax;
      o[c] = uint8_t(int32_t(q));
    }
  }
}

}  // namespace

// x: (rows, C) contiguous, fp32 (dtype 0) or bf16 (dtype 1); w, b: (C) fp32; out: (rows, C) uint8. Returns 0, or
// 2 for bad sizes.
extern "C" int vitlab_layer_norm_quantize(const void* x, int dtype, const float* w, const float* b, void* out,
                                          int64_t rows, int64_t C, float eps, float inv_scale, float zero_point,
                                          float qmin, float qmax, int threads) {
  if (rows < 0 || C < 1 || !(qmin >= 0.0f && qmax <= 255.0f && qmin <= qmax)) return 2;
  if (dtype == 0)
    run<float>((const float*)x, w, b, (uint8_t*)out, rows, C, eps, inv_scale, zero_point, qmin, qmax, threads);
  else
    run<uint16_t>((const uint16_t*)x, w, b, (uint8_t*)out, rows, C, eps, inv_scale, zero_point, qmin, qmax,
                  threads);
  return 0;
}
