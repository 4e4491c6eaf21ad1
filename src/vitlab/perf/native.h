// What the C++ kernel files of vitlab.perf share: `vitlab.perf.native.load` puts this file before each of them.
//
// The CPU checks the kernels make before running (cpuid): a direct call of an op on a CPU without the instructions
// gets a RuntimeError, not an illegal instruction.
#pragma once

// AVX-512 F, BW, DQ, VL and FMA: what every kernel is compiled for.
inline bool vitlab_cpu_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}

// The same with AVX512-VNNI (VPDPBUSD): the int8 kernels.
inline bool vitlab_cpu_avx512_vnni() { return vitlab_cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }
