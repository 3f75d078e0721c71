// The host's arithmetic peak, measured: independent chains of fused multiply-adds in the widest
// vector registers the build has (-march=native), on T threads at once. Compiled and run by
// benchmarks/flop_bound.py (no part of the package).
//
//   fma_peak f|b THREADS ITERATIONS   ->   "seconds GFLOP/s sink"   ("none" where b is unbuilt)
//
// f: float32 FMAs (AVX-512: 16 lanes; else AVX2: 8), 2 FLOP per lane and instruction.
// b: AVX512_BF16's VDPBF16PS (pairs of bfloat16 products summed into 16 float32 lanes), 4 FLOP
//    per lane and instruction: what a bfloat16 product with float32 sums can use where the host
//    has no AMX tiles.
// Each chain waits for its own previous result, so the chains (more than latency × issue
// width on the x86 hosts seen) keep the FMA units busy; the sums are printed so nothing is
// optimised away.
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#if defined(__AVX512F__)
using V = __m512;
constexpr int kLanes = 16, kChains = 16;
inline V Set(float x) { return _mm512_set1_ps(x); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float Sum(V v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
using V = __m256;
constexpr int kLanes = 8, kChains = 12;
inline V Set(float x) { return _mm256_set1_ps(x); }
inline V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float Sum(V v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}
#else
#error "fma_peak needs AVX2 with FMA, or AVX-512"
#endif

// kChains independent chains of `step`, each step waiting for its own previous result.
template <typename Step>
float Chains(long iterations, Step step) {
  V acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = Set(1.0f + k);
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains; ++k) acc[k] = step(acc[k]);
  }
  float s = 0;
  for (int k = 0; k < kChains; ++k) s += Sum(acc[k]);
  return s;
}

float Float32(long iterations) {
  const V a = Set(0.9999999f), b = Set(1e-7f);
  return Chains(iterations, [a, b](V x) { return Fma(x, a, b); });
}

#if defined(__AVX512BF16__)  // implies AVX-512F: V is __m512
float Bfloat16(long iterations) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // 2^-24
  return Chains(iterations, [a, b](V x) { return _mm512_dpbf16_ps(x, a, b); });
}
#endif

int main(int argc, char** argv) {
  if (argc != 4 || (argv[1][0] != 'f' && argv[1][0] != 'b')) {
    std::fprintf(stderr, "usage: fma_peak f|b THREADS ITERATIONS\n");
    return 2;
  }
  const bool bf16 = argv[1][0] == 'b';
  const int threads = std::atoi(argv[2]);
  const long iterations = std::atol(argv[3]);
  if (threads < 1 || iterations < 1) {
    std::fprintf(stderr, "fma_peak: THREADS and ITERATIONS must be >= 1\n");
    return 2;
  }
#if !defined(__AVX512BF16__)
  if (bf16) {
    std::printf("none\n");
    return 0;
  }
#endif
  std::vector<float> out(static_cast<size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&out, t, bf16, iterations] {
#if defined(__AVX512BF16__)
      out[static_cast<size_t>(t)] = bf16 ? Bfloat16(iterations) : Float32(iterations);
#else
      (void)bf16;
      out[static_cast<size_t>(t)] = Float32(iterations);
#endif
    });
  }
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = 2.0 * kLanes * kChains * (bf16 ? 2.0 : 1.0) * iterations * threads;
  float sink = 0;
  for (float x : out) sink += x;
  std::printf("%.6f %.3f %g\n", s, flops / s / 1e9, sink);
  return 0;
}
