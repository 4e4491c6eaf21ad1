// Static int8 linear layer for x86 CPUs with AVX512-VNNI (`vitlab::int8_linear`, the GEMMs of a static int8 ViT):
//
//   acc[m, n] = sum_k x[m, k] w[n, k]                     x: uint8 codes, w: int8, exact in int32 (VPDPBUSD)
//   y[m, n]   = (acc[m, n] - zc[n]) * scale[n] + bias[n]   zc = x's zero point * sum_k w[n, k]; scale = s_x * s_w[n]
//   y = gelu(y) (erf)  if asked;  y += residual[m, n]  if given
//   written as fp32, bf16 (round half to even) or uint8 codes: clamp(round_half_even(y / out_scale) + zero_point).
//
// Compiled at run time by Inductor's C++ builder with torch's headers (vitlab/perf/native.py loads it) and registered
// as the op's CPU kernel through torch's stable C ABI (the schema is defined in int8_linear.py, which also packs the
// weights). The weight is packed in panels of 64 output columns: [N/64][K/4][64][4] int8, the four bytes of one
// column that one VPDPBUSD lane reads side by side. A register tile is 6 rows x 64 columns: 24 int32 accumulators,
// four weight vectors loaded and six 4-byte broadcasts of x per step of 4 along K (29 of the 32 zmm registers); the
// epilogue runs on the accumulators in registers and each output is written once.
#include <immintrin.h>
#include <omp.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#define VITLAB_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))

namespace {

constexpr int kMR = 6;        // rows per register tile
constexpr int kPanel = 64;    // output columns per packed weight panel (four 16-lane vectors)

enum OutKind { kFloat = 0, kBFloat16 = 1, kCodes = 2 };

struct Epilogue {
  const int32_t* zc;     // (N) x's zero point * sum_k w[n, k]
  const float* scale;    // (N) s_x * s_w[n]
  const float* bias;     // (N)
  const float* resid;    // (M, N) row-major, or null
  bool gelu;
  int kind;              // OutKind
  float inv;             // 1 / out_scale (codes)
  int32_t zp;            // out zero point (codes)
  void* out;             // (M, N) row-major
  int64_t N;
};

// gelu(y) = 0.5 y (1 + erf(y / sqrt 2)), erf by a rational function of u^2 on u clamped to [-4, 4] (past 4, erf is
// 1 in fp32): u P(u^2) / Q(u^2), P of degree 6 and Q of degree 4 (Eigen's and XLA's fp32 erf coefficients);
// |error| < 5e-7 on erf and < 1e-6 on gelu in fp32, measured against torch.erf in float64 (tests). NaN stays NaN.
VITLAB_TARGET inline __m512 gelu16(__m512 y) {
  const __m512 u = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(y, _mm512_set1_ps(0.70710678118654752f)),
                                               _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
  const __m512 u2 = _mm512_mul_ps(u, u);
  __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(-1.60960333262415e-02f));
  __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
  q = _mm512_fmadd_ps(q, u2, _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(q, u2, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(q, u2, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(q, u2, _mm512_set1_ps(-1.42647390514189e-02f));
  __m512 r = _mm512_rcp14_ps(q);  // 1 / q to 2^-14, then one Newton step (q is in [-0.0143, -0.0114]: no zero)
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(q, r, _mm512_set1_ps(2.0f)));
  const __m512 erf = _mm512_mul_ps(_mm512_mul_ps(u, p), r);
  const __m512 half = _mm512_mul_ps(y, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half, erf, half);  // max/min above turned a NaN y into -4; `half` carries it through
}

// acc (MR x 64, int32) = rows m0 .. m0 + MR - 1 of x (row stride K) . one weight panel. Kept to the products alone
// so that the compiler holds the 4 * MR accumulators in registers (with the epilogue in the same function, GCC spilled
// them to the stack on every step).
template <int MR>
VITLAB_TARGET inline void products(const uint8_t* a, int64_t K, const int8_t* panel, int32_t* acc_out) {
  __m512i acc[MR][4];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_si512();
  const int64_t ksteps = K / 4;
  for (int64_t kk = 0; kk < ksteps; ++kk) {
    const int8_t* b = panel + kk * 4 * kPanel;
    const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64), b2 = _mm512_loadu_si512(b + 128),
                  b3 = _mm512_loadu_si512(b + 192);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t a4;
      std::memcpy(&a4, a + i * K + kk * 4, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], av, b1);
      acc[i][2] = _mm512_dpbusd_epi32(acc[i][2], av, b2);
      acc[i][3] = _mm512_dpbusd_epi32(acc[i][3], av, b3);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_store_si512(acc_out + i * kPanel + 16 * j, acc[i][j]);
}

// One row's 64 outputs (four vectors of 16 columns, n .. n + 63), written in whole 64-byte stores: bf16 two vectors
// at a time, uint8 codes all four at once, narrowed in registers by permutes and packs (narrowing each vector with
// VPMOVDW / VPMOVDB and storing it alone was 1.5% slower over a batch-1 forward, 3.7% at batch 8, on Zen 4).
VITLAB_TARGET inline void store_row(const Epilogue& e, int64_t m, int64_t n, const __m512 (&y)[4]) {
  const int64_t at = m * e.N + n;
  if (e.kind == kFloat) {
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(static_cast<float*>(e.out) + at + 16 * j, y[j]);
  } else if (e.kind == kBFloat16) {  // round half to even in the 16 bits on top (NaN stays NaN), then keep those
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                         31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512i r[4];
    for (int j = 0; j < 4; ++j) {
      const __m512i u = _mm512_castps_si512(y[j]);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      r[j] = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
      r[j] = _mm512_mask_mov_epi32(r[j], _mm512_cmp_ps_mask(y[j], y[j], _CMP_UNORD_Q),
                                   _mm512_set1_epi32(0x7fc00000));
    }
    uint16_t* o = static_cast<uint16_t*>(e.out) + at;
    _mm512_storeu_si512(o, _mm512_permutex2var_epi16(r[0], odd, r[1]));
    _mm512_storeu_si512(o + 32, _mm512_permutex2var_epi16(r[2], odd, r[3]));
  } else {  // quantize_per_tensor's arithmetic: clamp(round_half_even(y / out_scale) + zero_point, 0, 255)
    __m512i c[4];
    for (int j = 0; j < 4; ++j) {
      // rounded by the conversion (MXCSR: half to even); capped at 256 first, since past 2^31 it gives INT_MIN.
      // min(256, NaN) is NaN, which converts to INT_MIN: NaN, -inf and large negatives end at 0 in the packs below
      const __m512 v = _mm512_min_ps(_mm512_set1_ps(256.0f), _mm512_mul_ps(y[j], _mm512_set1_ps(e.inv)));
      c[j] = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(e.zp));
    }
    // packs saturate to int16 and packus to [0, 255]: the clamp. In each 128-bit lane l: dword p holds vector p's
    // columns 4l .. 4l + 3; put them back in column order
    const __m512i packed = _mm512_packus_epi16(_mm512_packs_epi32(c[0], c[1]), _mm512_packs_epi32(c[2], c[3]));
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_si512(static_cast<uint8_t*>(e.out) + at, _mm512_permutexvar_epi32(order, packed));
  }
}

// Rows m0 .. m0 + MR - 1 against the panel of columns n0 .. n0 + 63, the epilogue row by row (from L1).
template <int MR>
VITLAB_TARGET void tile(const uint8_t* x, int64_t K, const int8_t* panel, int64_t m0, int64_t n0, const Epilogue& e) {
  alignas(64) int32_t acc[MR * kPanel];
  products<MR>(x + m0 * K, K, panel, acc);
  __m512i zc[4];
  __m512 sc[4], bi[4];
  for (int j = 0; j < 4; ++j) {
    zc[j] = _mm512_loadu_si512(e.zc + n0 + 16 * j);
    sc[j] = _mm512_loadu_ps(e.scale + n0 + 16 * j);
    bi[j] = _mm512_loadu_ps(e.bias + n0 + 16 * j);
  }
  for (int i = 0; i < MR; ++i) {
    __m512 y[4];
    for (int j = 0; j < 4; ++j)
      y[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(acc + i * kPanel + 16 * j), zc[j])),
                             sc[j], bi[j]);
    if (e.gelu)
      for (int j = 0; j < 4; ++j) y[j] = gelu16(y[j]);
    if (e.resid)
      for (int j = 0; j < 4; ++j)
        y[j] = _mm512_add_ps(y[j], _mm512_loadu_ps(e.resid + (m0 + i) * e.N + n0 + 16 * j));
    store_row(e, m0 + i, n0, y);
  }
}
VITLAB_TARGET void rows_tile(int rows, const uint8_t* x, int64_t K, const int8_t* panel, int64_t m0, int64_t n0,
                             const Epilogue& e) {
  switch (rows) {
    case 1: tile<1>(x, K, panel, m0, n0, e); break;
    case 2: tile<2>(x, K, panel, m0, n0, e); break;
    case 3: tile<3>(x, K, panel, m0, n0, e); break;
    case 4: tile<4>(x, K, panel, m0, n0, e); break;
    case 5: tile<5>(x, K, panel, m0, n0, e); break;
    default: tile<kMR>(x, K, panel, m0, n0, e);
  }
}

// Work items: (panel, chunk of row tiles), panel-major, so a thread's consecutive items share the panel it keeps
// in cache; each thread takes its share, then what the others have not reached (vitlab_parallel_items). Rows are cut
// into chunks only where there are too few panels to give every thread several.
void run(const uint8_t* x, int64_t M, int64_t K, const int8_t* w, const Epilogue& e, int threads) {
  const int64_t panels = e.N / kPanel, tiles = (M + kMR - 1) / kMR;
  int64_t chunks = (4 * int64_t(threads) + panels - 1) / panels;
  if (chunks > tiles) chunks = tiles;
  if (chunks < 1) chunks = 1;
  const int64_t per = (tiles + chunks - 1) / chunks;
  const int64_t items = panels * chunks;
  auto item = [&](int64_t it) {
    const int64_t p = it / chunks, c = it % chunks;
    const int8_t* panel = w + p * K * kPanel;
    const int64_t t1 = (c + 1) * per < tiles ? (c + 1) * per : tiles;
    for (int64_t t = c * per; t < t1; ++t) {
      const int64_t m0 = t * kMR;
      rows_tile(int(M - m0 < kMR ? M - m0 : kMR), x, K, panel, m0, p * kPanel, e);
    }
  };
  vitlab_parallel_items(items, threads, item);
}

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor int8_linear(Tensor x, Tensor w_packed, Tensor zc, Tensor scale, Tensor bias, std::optional<Tensor> residual,
                   bool gelu, ScalarType out_dtype, double out_scale, int64_t out_zero_point) {
  STD_TORCH_CHECK(vitlab_cpu_avx512_vnni(), "int8_linear needs AVX512-VNNI; this CPU lacks it");
  STD_TORCH_CHECK(x.scalar_type() == ScalarType::Byte && x.dim() >= 1, "int8_linear takes uint8 codes x (..., K)");
  STD_TORCH_CHECK(w_packed.scalar_type() == ScalarType::Char && w_packed.dim() == 4 && w_packed.size(2) == kPanel &&
                      w_packed.size(3) == 4,
                  "int8_linear takes a weight packed by vitlab.perf.int8_linear.pack: int8 (N/64, K/4, 64, 4)");
  const int64_t K = x.size(x.dim() - 1), N = w_packed.size(0) * kPanel;
  STD_TORCH_CHECK(w_packed.size(1) * 4 == K, "int8_linear: x's last dimension ", K, " is not the weight's K (",
                  w_packed.size(1) * 4, ")");
  STD_TORCH_CHECK(zc.scalar_type() == ScalarType::Int && zc.dim() == 1 && zc.size(0) == N &&
                      scale.scalar_type() == ScalarType::Float && scale.dim() == 1 && scale.size(0) == N &&
                      bias.scalar_type() == ScalarType::Float && bias.dim() == 1 && bias.size(0) == N,
                  "int8_linear needs int32 zc and fp32 scale and bias of the weight's N (", N, ")");
  STD_TORCH_CHECK(out_dtype == ScalarType::Float || out_dtype == ScalarType::BFloat16 ||
                      out_dtype == ScalarType::Byte,
                  "int8_linear writes fp32, bf16 or uint8 codes");
  STD_TORCH_CHECK(out_dtype != ScalarType::Byte ||
                      (out_scale > 0.0 && out_scale < INFINITY && out_zero_point >= 0 && out_zero_point <= 255),
                  "int8_linear writing uint8 codes needs a positive, finite scale and a zero point in [0, 255]");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  const int64_t M = x.numel() / (K > 0 ? K : 1);
  if (residual.has_value()) {
    STD_TORCH_CHECK(residual->scalar_type() == ScalarType::Float && residual->numel() == M * N &&
                        residual->dim() >= 1 && residual->size(residual->dim() - 1) == N,
                    "int8_linear's residual must be fp32 of the output's shape");
    if (!residual->is_contiguous()) residual = torch::stable::contiguous(*residual);
  }
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  if (!w_packed.is_contiguous()) w_packed = torch::stable::contiguous(w_packed);
  if (!zc.is_contiguous()) zc = torch::stable::contiguous(zc);
  if (!scale.is_contiguous()) scale = torch::stable::contiguous(scale);
  if (!bias.is_contiguous()) bias = torch::stable::contiguous(bias);
  Tensor out = torch::stable::new_empty(x, shape, out_dtype);
  if (M == 0 || N == 0) return out;
  const Epilogue e{static_cast<const int32_t*>(zc.data_ptr()),
                   static_cast<const float*>(scale.data_ptr()),
                   static_cast<const float*>(bias.data_ptr()),
                   residual.has_value() ? static_cast<const float*>(residual->data_ptr()) : nullptr,
                   gelu,
                   out_dtype == ScalarType::Float ? kFloat : (out_dtype == ScalarType::BFloat16 ? kBFloat16 : kCodes),
                   float(1.0 / out_scale),
                   int32_t(out_zero_point),
                   out.data_ptr(),
                   N};
  run(static_cast<const uint8_t*>(x.data_ptr()), M, K, static_cast<const int8_t*>(w_packed.data_ptr()), e,
      int(torch::stable::get_num_threads()));
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(vitlab, CPU, m) { m.impl("int8_linear", TORCH_BOX(&int8_linear)); }
