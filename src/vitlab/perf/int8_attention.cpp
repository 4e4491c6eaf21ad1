// Fused int8 attention for x86 CPUs with AVX512-VNNI: out = softmax(scale * q k^T) v, one (image, head) at a time.
//
// Compiled at run time by Inductor's C++ builder with torch's headers (vitlab/perf/native.py loads it) and registered
// as the CPU kernels of vitlab::int8_attention and vitlab::int8_attention_quantized through torch's stable C ABI
// (the ops' schemas are defined in int8_attention.py). Per (image, head), in L1/L2:
//   1. q, k quantised to int8 per row (token), v per column (head channel): symmetric, step max|x| / 127, round half
//      to even. q is shifted to uint8 (+128) for VPDPBUSD (u8 x s8 -> s32); -128 * sum_d k8[j, d] takes it back out.
//   2. Per row of q: scores q8 . k8 in int32 (VPDPBUSD), rescaled to fp32 by the steps of q and k, the softmax scale
//      and log2(e); then 255 * 2^(x - max x) (so exp(s - max s) * 255), rounded to uint8: the row's largest is 255.
//   3. out = (p8 v8) * step_v[d] / sum_j (255 * 2^(x_j - max x)) in int32 (VPDPBUSD), written in the input dtype.
// Non-finite inputs give non-finite outputs where they reach: a row or column with one gets a non-finite step.
#include <immintrin.h>
#include <omp.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#define VITLAB_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))

namespace {

constexpr int kMaxRows = 4;  // rows of p v per register tile (and rows of probabilities held at a time)
constexpr int kMaxVecs = 4;  // 16-lane int32 vectors per register tile row of p v

VITLAB_TARGET inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
VITLAB_TARGET inline __m512 load16(const uint16_t* p) {  // bf16 -> fp32: the 16 bits on top
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
VITLAB_TARGET inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
VITLAB_TARGET inline void store16(uint16_t* p, __m512 x) {  // fp32 -> bf16, round half to even, NaN kept NaN
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
}

// The output's quantisation when it is written as uint8 codes (the int8 GEMM after attention reads them):
// clamp(round_half_even(x * inv) + zero_point, 0, 255); NaN becomes 0.
struct OutQuant {
  float inv;
  int32_t zero_point;
};
template <typename T>
VITLAB_TARGET inline void store_out(T* p, __m512 x, const OutQuant&) { store16(p, x); }
VITLAB_TARGET inline void store_out(uint8_t* p, __m512 x, const OutQuant& oq) {
  __m512i c = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(oq.inv))),
                               _mm512_set1_epi32(oq.zero_point));  // NaN: INT_MIN + zero point, clamped to 0
  c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()), _mm512_set1_epi32(255));
  _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(c));
}

VITLAB_TARGET inline __m512 exp2_16(__m512 t) {  // 2^t for t <= 8 (and NaN): 2^n * p(f), |rel err| < 1e-5
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(t, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(1.3333558e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// C[MR x 16*NR] (int32, row stride ldc) = A[MR x 4*ksteps] (uint8, row stride lda) . B, B packed as
// [kstep][column][4] int8 with `ldb` bytes per kstep (the layout VPDPBUSD reads: 4 bytes of a column per lane).
template <int MR, int NR>
VITLAB_TARGET void tile(const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int ksteps, int32_t* C,
                        int64_t ldc) {
  __m512i acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_si512();
  for (int kk = 0; kk < ksteps; ++kk) {
    __m512i b[NR];
    for (int n = 0; n < NR; ++n) {
      b[n] = _mm512_loadu_si512((const void*)(B + kk * ldb + n * 64));
      __asm__("" : "+v"(b[n]));  // keep it in a register: one load for all MR rows
    }
    for (int m = 0; m < MR; ++m) {
      int32_t a4;
      std::memcpy(&a4, A + m * lda + kk * 4, 4);
      __m512i a = _mm512_set1_epi32(a4);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], a, b[n]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) _mm512_storeu_si512((void*)(C + m * ldc + n * 16), acc[m][n]);
}

template <int MR>
VITLAB_TARGET void tile_n(int nr, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int ksteps,
                          int32_t* C, int64_t ldc) {
  switch (nr) {
    case 1: tile<MR, 1>(A, lda, B, ldb, ksteps, C, ldc); break;
    case 2: tile<MR, 2>(A, lda, B, ldb, ksteps, C, ldc); break;
    case 3: tile<MR, 3>(A, lda, B, ldb, ksteps, C, ldc); break;
    default: tile<MR, 4>(A, lda, B, ldb, ksteps, C, ldc); break;
  }
}

// C[rows x 16*vecs] = A[rows x 4*ksteps] . B (rows <= kMaxRows), in near-equal register tiles of <= kMaxVecs vectors
// (ViT's 197 tokens: 3 + 3 + 3 + 4 column vectors of scores; 4 + 4 + 4 + 1 was 2% slower).
VITLAB_TARGET void gemm_rows(int rows, int vecs, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb,
                             int ksteps, int32_t* C, int64_t ldc) {
  const int tiles = (vecs + kMaxVecs - 1) / kMaxVecs;
  for (int t = 0, n0 = 0; t < tiles; n0 += vecs / tiles + (t < vecs % tiles), ++t) {
    const int nr = vecs / tiles + (t < vecs % tiles);
    const int8_t* Bn = B + n0 * 64;
    int32_t* Cn = C + n0 * 16;
    switch (rows) {
      case 1: tile_n<1>(nr, A, lda, Bn, ldb, ksteps, Cn, ldc); break;
      case 2: tile_n<2>(nr, A, lda, Bn, ldb, ksteps, Cn, ldc); break;
      case 3: tile_n<3>(nr, A, lda, Bn, ldb, ksteps, Cn, ldc); break;
      default: tile_n<4>(nr, A, lda, Bn, ldb, ksteps, Cn, ldc); break;
    }
  }
}

// One row of int32 scores s (`vecs` column vectors) to fp32 in log2 units, in place: x[c] = (s[c] + init[c]) *
// col[c] * row. Returns the largest x over the valid columns (`last` masks the final vector); a NaN score is left
// to reach the row sum.
VITLAB_TARGET float scale_row(int vecs, const int32_t* s, const int32_t* init, const float* col, float row, float* x,
                              __mmask16 last) {
  const __m512 r = _mm512_set1_ps(row);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int n = 0; n < vecs; ++n) {
    const __m512i a = _mm512_add_epi32(_mm512_loadu_si512((const void*)(s + n * 16)),
                                       _mm512_loadu_si512((const void*)(init + n * 16)));
    const __m512 xn = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(col + n * 16)), r);
    _mm512_storeu_ps(x + n * 16, xn);
    mx = n + 1 < vecs ? _mm512_max_ps(mx, xn) : _mm512_mask_max_ps(mx, last, mx, xn);
  }
  return _mm512_reduce_max_ps(mx);
}

// Quantisation step for values of largest magnitude `amax`: amax / 127 (1 for an all-zero row, so it stays zero;
// non-finite for a non-finite row, which then spreads to the outputs it touches).
inline float step_of(float amax) { return amax > 0.0f ? amax / 127.0f : (amax == 0.0f ? 1.0f : amax); }

// round(x * inv) to int32, half to even (MXCSR's default). With inv = 127 / max |x| it stays in [-127, 127]; a
// non-finite row (inv = 0: NaN products) gives garbage codes, harmless under its NaN step.
VITLAB_TARGET inline __m512i round16(__m512 x, float inv) {
  return _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inv)));
}

struct Scratch {
  uint8_t* q8;       // (N, D) q + 128
  float* sq;         // (N) q steps * scale * log2(e)
  int8_t* kp;        // [D/4][Nv][4]
  float* sk;         // (Nv) k steps (0 past N)
  int32_t* kc;       // (Nv) -128 * sum_d k8
  int8_t* vp;        // [Np/4][D][4]
  float* sv;         // (D) v steps
  float* vf;         // (N, D) v in fp32
  float* vmax;       // (D) max |v| per column
  float* x;          // (kMaxRows, Nv) rows of scores
  uint8_t* p8;       // (kMaxRows, Nv): probabilities, zero past N
  int32_t* o;        // (kMaxRows, D)
  void* base;
};

inline size_t up64(size_t n) { return (n + 63) & ~size_t(63); }

// q, k, v rows are one head's slice of a token's fused qkv row, and the output rows one head's slice of a token's
// (B, N, H*D) row: thousands of bytes apart, each on another page, where the hardware prefetchers stop. Reading or
// writing them in order costs a memory latency per row; asking rows ahead (for writing, for the output) overlaps
// those latencies (measured on Zen 4, one thread: 1.5x faster with the reads prefetched, 1.1x more with the writes).
constexpr int64_t kAhead = 8;

template <typename T, bool kWrite = false>
inline void prefetch_row(const T* p, int64_t D) {
  for (int64_t b = 0; b < D * int64_t(sizeof(T)); b += 64) __builtin_prefetch((const char*)p + b, kWrite, 3);
}

// This thread's scratch for (N, D), kept between calls (the OpenMP pool's threads live on): allocating and zeroing
// it per call cost page faults. Zeroed whenever its shape changes: the padding (columns of k and rows of v past N,
// probabilities past N) must read zero and is never written.
Scratch& scratch_for(int64_t N, int64_t D, int64_t Nv, int64_t Np) {
  thread_local Scratch sc{};
  thread_local int64_t shape[2] = {-1, -1};
  if (shape[0] == N && shape[1] == D && sc.base) return sc;
  std::free(sc.base);
  sc = Scratch{};
  shape[0] = shape[1] = -1;
  size_t sizes[] = {up64(N * D), up64(N * 4), up64(D * Nv), up64(Nv * 4), up64(Nv * 4), up64(Np * D), up64(D * 4),
                    up64(kMaxRows * Nv * 4), up64(kMaxRows * Nv), up64(kMaxRows * D * 4), up64(N * D * 4),
                    up64(D * 4)};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  char* b = static_cast<char*>(std::aligned_alloc(64, total));
  if (!b) return sc;
  std::memset(b, 0, total);
  sc.base = b;
  char* p = b;
  auto take = [&](int i) { char* r = p; p += sizes[i]; return r; };
  sc.q8 = (uint8_t*)take(0); sc.sq = (float*)take(1); sc.kp = (int8_t*)take(2); sc.sk = (float*)take(3);
  sc.kc = (int32_t*)take(4); sc.vp = (int8_t*)take(5); sc.sv = (float*)take(6); sc.x = (float*)take(7);
  sc.p8 = (uint8_t*)take(8); sc.o = (int32_t*)take(9); sc.vf = (float*)take(10); sc.vmax = (float*)take(11);
  shape[0] = N;
  shape[1] = D;
  return sc;
}

template <typename T>
VITLAB_TARGET inline float load_row(const T* src, int64_t D, float* r) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t d = 0; d < D; d += 16) {
    __m512 x = load16(src + d);
    _mm512_store_ps(r + d, x);
    __m512 a = _mm512_abs_ps(x);
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, a);
  }
  return nan ? NAN : step_of(_mm512_reduce_max_ps(m));
}

template <typename T, typename TO>
VITLAB_TARGET void one_head(const T* q, int64_t qs, const T* k, int64_t ks, const T* v, int64_t vs, TO* out,
                            int64_t os, int64_t N, int64_t D, int64_t Nv, int64_t Np, float scale,
                            const OutQuant& oq, const Scratch& sc) {
  const int ksteps_qk = int(D / 4), ksteps_pv = int(Np / 4), vecs_s = int(Nv / 16), vecs_o = int(D / 16);
  constexpr float kLog2e = 1.44269504088896341f;
  alignas(64) float r[256];
  // One pass over the tokens: q per-row int8 shifted to uint8 (its step carries the softmax scale and log2(e): the
  // softmax runs in base 2); k per-row int8 packed [D/4][Nv][4], kc = -128 * sum_d k8 taking the shift of q back
  // out; v kept in fp32 with the largest |v| per column. A token's q, k and v slices share its qkv row's page.
  float* vmax = sc.vmax;
  for (int64_t d = 0; d < D; ++d) vmax[d] = 0.0f;
  __mmask16 vnan[16] = {0};
  for (int64_t i = 0; i < kAhead && i < N; ++i) {
    prefetch_row(q + i * qs, D);
    prefetch_row(k + i * ks, D);
    prefetch_row(v + i * vs, D);
  }
  for (int64_t i = 0; i < N; ++i) {
    if (i + kAhead < N) {
      prefetch_row(q + (i + kAhead) * qs, D);
      prefetch_row(k + (i + kAhead) * ks, D);
      prefetch_row(v + (i + kAhead) * vs, D);
    }
    float step = load_row(q + i * qs, D, r);
    sc.sq[i] = step * scale * kLog2e;
    float inv = std::isfinite(step) ? 1.0f / step : 0.0f;
    for (int64_t d = 0; d < D; d += 16) {
      __m512i qi = _mm512_add_epi32(round16(_mm512_load_ps(r + d), inv), _mm512_set1_epi32(128));
      _mm_storeu_si128((__m128i*)(sc.q8 + i * D + d), _mm512_cvtepi32_epi8(qi));
    }
    step = load_row(k + i * ks, D, r);
    sc.sk[i] = step;
    inv = std::isfinite(step) ? 1.0f / step : 0.0f;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t d = 0; d < D; d += 16) {
      __m512i ki = round16(_mm512_load_ps(r + d), inv);
      sum = _mm512_add_epi32(sum, ki);
      alignas(16) int8_t b[16];
      _mm_store_si128((__m128i*)b, _mm512_cvtepi32_epi8(ki));
      for (int g = 0; g < 4; ++g) std::memcpy(sc.kp + ((d / 4 + g) * Nv + i) * 4, b + 4 * g, 4);
    }
    sc.kc[i] = -128 * _mm512_reduce_add_epi32(sum);
    float* vrow = sc.vf + i * D;
    for (int64_t d = 0; d < D; d += 16) {
      __m512 x = load16(v + i * vs + d);
      _mm512_storeu_ps(vrow + d, x);
      __m512 a = _mm512_abs_ps(x);
      vnan[d / 16] |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
      _mm512_store_ps(vmax + d, _mm512_max_ps(_mm512_load_ps(vmax + d), a));
    }
  }
  // v: per-column int8, packed [Np/4][D][4] (rows past N zero)
  for (int64_t d = 0; d < D; ++d) {
    sc.sv[d] = (vnan[d / 16] >> (d % 16)) & 1 ? NAN : step_of(vmax[d]);
    r[d] = std::isfinite(sc.sv[d]) ? 1.0f / sc.sv[d] : 0.0f;  // r: 1 / step per column
  }
  for (int64_t j0 = 0; j0 < N; j0 += 4) {
    for (int64_t d = 0; d < D; d += 16) {
      __m128i g4[4];
      for (int g = 0; g < 4; ++g) {
        if (j0 + g < N) {
          __m512 y = _mm512_mul_ps(_mm512_loadu_ps(sc.vf + (j0 + g) * D + d), _mm512_load_ps(r + d));
          g4[g] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(y));
        } else {
          g4[g] = _mm_setzero_si128();
        }
      }
      __m128i t0 = _mm_unpacklo_epi8(g4[0], g4[1]), t1 = _mm_unpackhi_epi8(g4[0], g4[1]);
      __m128i t2 = _mm_unpacklo_epi8(g4[2], g4[3]), t3 = _mm_unpackhi_epi8(g4[2], g4[3]);
      int8_t* dst = sc.vp + ((j0 / 4) * D + d) * 4;
      _mm_storeu_si128((__m128i*)(dst + 0), _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128((__m128i*)(dst + 16), _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128((__m128i*)(dst + 32), _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128((__m128i*)(dst + 48), _mm_unpackhi_epi16(t1, t3));
    }
  }
  // rows of the output, kMaxRows at a time: S rows -> softmax -> uint8 p -> p v
  const int64_t full = N / 16 * 16;
  const __mmask16 tail = __mmask16((1u << (N % 16)) - 1);
  const __m512 to255 = _mm512_set1_ps(7.99435344f);  // log2(255): the row's largest p becomes 255
  float rowf[kMaxRows];
  for (int64_t i = 0; i < kMaxRows && i < N; ++i) prefetch_row<TO, true>(out + i * os, D);
  for (int64_t i0 = 0; i0 < N; i0 += kMaxRows) {
    int rows = int(N - i0 < kMaxRows ? N - i0 : kMaxRows);
    for (int64_t i = i0 + kMaxRows; i < i0 + 2 * kMaxRows && i < N; ++i) prefetch_row<TO, true>(out + i * os, D);
    // x = log2(e) * scale * q.k for the rows (the steps of q carry scale and log2(e)): int32 in x's memory, then
    // fp32 in place
    gemm_rows(rows, vecs_s, sc.q8 + i0 * D, D, sc.kp, Nv * 4, ksteps_qk, reinterpret_cast<int32_t*>(sc.x), Nv);
    for (int m = 0; m < rows; ++m) {
      // the row's softmax as uint8
      const float* xrow = sc.x + m * Nv;
      float rmax = scale_row(vecs_s, reinterpret_cast<const int32_t*>(xrow), sc.kc, sc.sk, sc.sq[i0 + m],
                             sc.x + m * Nv, tail ? tail : __mmask16(0xffff));
      if (!(rmax > -INFINITY)) rmax = -INFINITY;  // a NaN max: the NaN scores reach the row sum instead
      int64_t j = 0;
      const __m512 shift = _mm512_sub_ps(_mm512_set1_ps(rmax), to255);
      __m512 sum = _mm512_setzero_ps();
      uint8_t* prow = sc.p8 + m * Nv;
      for (j = 0; j < full; j += 16) {  // p = 255 * 2^(x - max), NaN stays NaN (and reaches the sum)
        __m512 p = exp2_16(_mm512_sub_ps(_mm512_loadu_ps(xrow + j), shift));
        sum = _mm512_add_ps(sum, p);
        _mm_storeu_si128((__m128i*)(prow + j), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(p)));
      }
      if (tail) {
        __m512 p = _mm512_maskz_mov_ps(tail, exp2_16(_mm512_sub_ps(_mm512_loadu_ps(xrow + j), shift)));
        sum = _mm512_add_ps(sum, p);
        _mm_storeu_si128((__m128i*)(prow + j), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(p)));
      }
      float total = _mm512_reduce_add_ps(sum);  // NaN or inf where a score was
      rowf[m] = total > 0.0f && total < INFINITY ? 1.0f / total : NAN;
    }
    gemm_rows(rows, vecs_o, sc.p8, Nv, sc.vp, D * 4, ksteps_pv, sc.o, D);  // p v, kMaxRows rows at a time
    for (int m = 0; m < rows; ++m) {
      __m512 f = _mm512_set1_ps(rowf[m]);
      for (int64_t d = 0; d < D; d += 16) {
        __m512 o = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void*)(sc.o + m * D + d)));
        store_out(out + (i0 + m) * os + d, _mm512_mul_ps(_mm512_mul_ps(o, f), _mm512_loadu_ps(sc.sv + d)), oq);
      }
    }
  }
}

template <typename T, typename TO>
int run(const T* q, const T* k, const T* v, TO* out, int64_t B, int64_t H, int64_t N, int64_t D,
        const int64_t* st, float scale, const OutQuant& oq, int threads) {
  const int64_t Nv = (N + 15) / 16 * 16, Np = (N + 3) / 4 * 4;
  int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
  {
    const Scratch& sc = scratch_for(N, D, Nv, Np);
    if (!sc.base) {
      failed = 1;
    } else {
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < B * H; ++bh) {
        int64_t b = bh / H, h = bh % H;
        one_head<T, TO>(q + b * st[0] + h * st[1], st[2], k + b * st[3] + h * st[4], st[5],
                        v + b * st[6] + h * st[7], st[8], out + b * st[9] + h * st[10], st[11], N, D, Nv, Np,
                        scale, oq, sc);
      }
    }
  }
  return failed;
}

template <typename T>
int run_to(const void* q, const void* k, const void* v, void* out, bool codes, int64_t B, int64_t H, int64_t N,
           int64_t D, const int64_t* st, float scale, const OutQuant& oq, int threads) {
  if (codes)
    return run<T, uint8_t>((const T*)q, (const T*)k, (const T*)v, (uint8_t*)out, B, H, N, D, st, scale, oq,
                           threads);
  return run<T, T>((const T*)q, (const T*)k, (const T*)v, (T*)out, B, H, N, D, st, scale, oq, threads);
}

}  // namespace

// q, k, v, out: (B, H, N, D) with D contiguous; strides (in elements) in st: b, h, n of q, k, v, out in turn.
// dtype 0: fp32, 1: bf16 (q, k, v; and out unless codes). codes 1: out is uint8, quantised per tensor with step
// 1 / out_inv_scale and out_zero_point. Returns 0, or 1 when scratch memory could not be allocated, 2 for bad
// sizes.
static int vitlab_int8_attention(const void* q, const void* k, const void* v, void* out, int dtype, int codes,
                                 float out_inv_scale, int out_zero_point, int64_t B, int64_t H, int64_t N,
                                 int64_t D, const int64_t* st, float scale, int threads) {
  if (N < 1 || D < 16 || D % 16 != 0 || D > 256 || B < 0 || H < 0) return 2;
  const OutQuant oq{out_inv_scale, out_zero_point};
  if (dtype == 0) return run_to<float>(q, k, v, out, codes != 0, B, H, N, D, st, scale, oq, threads);
  return run_to<uint16_t>(q, k, v, out, codes != 0, B, H, N, D, st, scale, oq, threads);
}

// ---- the torch ops (the Python entry points in int8_attention.py check the same, with ValueErrors) ----
namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor attention(Tensor q, Tensor k, Tensor v, double scale, bool codes, double out_scale, int64_t zero_point) {
  STD_TORCH_CHECK(vitlab_cpu_avx512_vnni(), "int8 attention needs AVX512-VNNI; this CPU lacks it");
  STD_TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                  "int8_attention takes (B, heads, N, head_dim) q, k, v");
  for (int64_t i = 0; i < 4; ++i)
    STD_TORCH_CHECK(q.size(i) == k.size(i) && q.size(i) == v.size(i), "int8_attention needs q, k, v of one shape");
  const ScalarType dt = q.scalar_type();
  STD_TORCH_CHECK((dt == ScalarType::Float || dt == ScalarType::BFloat16) && k.scalar_type() == dt &&
                      v.scalar_type() == dt,
                  "int8_attention takes fp32 or bf16 q, k, v of one dtype");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  STD_TORCH_CHECK(D % 16 == 0 && D >= 16 && D <= 256,
                  "int8_attention needs a head dimension that is a multiple of 16 in [16, 256]; got ", D);
  STD_TORCH_CHECK(!codes || (out_scale > 0.0 && out_scale < INFINITY && zero_point >= 0 && zero_point <= 255),
                  "int8_attention_quantized writes uint8 codes: needs a positive, finite scale and a zero point "
                  "in [0, 255]");
  if (q.stride(3) != 1) q = torch::stable::contiguous(q);
  if (k.stride(3) != 1) k = torch::stable::contiguous(k);
  if (v.stride(3) != 1) v = torch::stable::contiguous(v);
  // (B, H, N, D) over (B, N, H, D) memory: the transpose(1, 2).reshape(B, N, H * D) after attention is free
  Tensor out = torch::stable::transpose(
      torch::stable::new_empty(q, {B, N, H, D}, codes ? ScalarType::Byte : dt), 1, 2);
  if (B * H * N == 0) return out;
  int64_t st[12];
  const Tensor* ts[4] = {&q, &k, &v, &out};
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 3; ++i) st[3 * t + i] = ts[t]->stride(i);
  const int rc = vitlab_int8_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                       dt == ScalarType::BFloat16, codes, float(1.0 / out_scale), int(zero_point),
                                       B, H, N, D, st, float(scale), int(torch::stable::get_num_threads()));
  STD_TORCH_CHECK(rc != 1, "int8_attention: no memory for its scratch buffers (N=", N, ", head_dim=", D, ")");
  STD_TORCH_CHECK(rc == 0, "int8_attention's kernel refused shape (", B, ", ", H, ", ", N, ", ", D, ")");
  return out;
}

Tensor int8_attention(Tensor q, Tensor k, Tensor v, double scale) {
  return attention(q, k, v, scale, false, 1.0, 0);
}

Tensor int8_attention_quantized(Tensor q, Tensor k, Tensor v, double scale, double out_scale, int64_t zero_point) {
  return attention(q, k, v, scale, true, out_scale, zero_point);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(vitlab, CPU, m) {
  m.impl("int8_attention", TORCH_BOX(&int8_attention));
  m.impl("int8_attention_quantized", TORCH_BOX(&int8_attention_quantized));
}
