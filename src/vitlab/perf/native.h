// What the C++ kernel files of vitlab.perf share: `vitlab.perf.native.load` puts this file before each of them.
//
// The CPU checks the kernels make before running (cpuid): a direct call of an op on a CPU without the instructions
// gets a RuntimeError, not an illegal instruction. And how they share their work between threads.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <vector>

// AVX-512 F, BW, DQ, VL and FMA: what every kernel is compiled for.
inline bool vitlab_cpu_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}

// The same with AVX512-VNNI (VPDPBUSD): the int8 kernels.
inline bool vitlab_cpu_avx512_vnni() { return vitlab_cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }

// fn(i) for i in [0, items) on `threads` OpenMP threads: each thread takes its own contiguous share from the front
// (the split `schedule(static)` makes, so neighbouring items stay on one core), then, once done, takes what is left
// of the others' shares from their back ends. On a host whose cores run at different speeds from one moment to the
// next (a VM's vCPUs), a static split waits for the slowest core; OpenMP's dynamic schedule balances but interleaves
// the items between cores. Measured on a 2-vCPU Zen 4 (the int8 GEMMs of a ViT-B/16, same process): 1.01-1.03x the
// static split at batch 1 and 8, where `schedule(dynamic, 1)` gave 0.99-1.02x.
template <typename Fn>
void vitlab_parallel_items(int64_t items, int threads, const Fn& fn) {
  if (threads < 1) threads = 1;
  if (threads == 1 || items < 2 || items > int64_t(0xffffffff)) {
    for (int64_t i = 0; i < items; ++i) fn(i);
    return;
  }
  struct alignas(64) Share {  // [lo, hi) of a thread's items not yet taken, as lo | hi << 32
    std::atomic<uint64_t> v;
  };
  std::vector<Share> shares(threads);
  for (int t = 0; t < threads; ++t)
    shares[t].v.store(uint64_t(items * t / threads) | (uint64_t(items * (t + 1) / threads) << 32),
                      std::memory_order_relaxed);
  // one item off the front (own share) or off the back (another's); -1 when that share is empty
  auto take = [](Share& s, bool front) -> int64_t {
    uint64_t v = s.v.load(std::memory_order_relaxed);
    while ((v & 0xffffffffu) < (v >> 32)) {
      const uint64_t next = front ? v + 1 : v - (uint64_t(1) << 32);
      if (s.v.compare_exchange_weak(v, next, std::memory_order_relaxed))
        return front ? int64_t(v & 0xffffffffu) : int64_t(v >> 32) - 1;
    }
    return -1;
  };
#pragma omp parallel num_threads(threads)
  {
    const int me = omp_get_thread_num();
    for (int64_t i; (i = take(shares[me], true)) >= 0;) fn(i);
    for (int d = 1; d < threads; ++d)  // every other share (also those of threads OpenMP did not start)
      for (int64_t i; (i = take(shares[(me + d) % threads], false)) >= 0;) fn(i);
  }
}
