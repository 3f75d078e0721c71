// s5jax native CPU kernels for the diagonal linear recurrence (XLA FFI custom calls).
//
// Compiled on first use by s5jax.core._native (the system C++ compiler, the XLA FFI headers
// that jaxlib ships) and registered as the CPU targets "s5jax_recurrence" and
// "s5jax_recurrence_adjoint" (complex or real arrays, below), and "s5jax_planar" and
// "s5jax_planar_adjoint" (complex states as real [Re | Im] rows, further down). One pass over
// memory each: the forward kernel reads b once and
// writes x once; the adjoint kernel reads g and x once and writes b̄ once (and ā, which is
// (P,) per sequence when a is time-invariant). The state lives in a small per-sequence buffer.
//
// Shapes (leading dims are flattened into N sequences; jax's vmap "broadcast_all" gives a and
// b the same leading dims):
//   b, x, g, b̄ : (N, L, P)
//   a, ā       : (N, P) when per_step is false (time-invariant Λ̄), else (N, L, P)
// Forward:  x_k = a_k x_{k-1} + b_k   (reverse: x_k = a_k x_{k+1} + b_k), zero initial state.
// Adjoint of the forward map for the cotangent g (no conjugation: JAX's convention for the VJP
// of a product of complex numbers):  λ_k = g_k + a_{k+1} λ_{k+1},  b̄_k = λ_k,
// ā_k = λ_k x_{k-1} (summed over k when a is time-invariant); with reverse, k+1 and k-1 swap.
//
// Complex products are written out in real arithmetic (no __mulsc3 calls) and the inner loop
// runs over P contiguous lanes, so the compiler vectorises it. The time-invariant ā is summed
// in the element precision over 256 steps at a time, then in double. Sequences (and, for the
// planar kernel, blocks of lanes) are claimed in chunks by the calling thread and helper tasks on
// XLA's CPU thread pool (one thread per available core, S5JAX_NATIVE_THREADS to override; ≥ 256k
// elements each, 64k for the planar kernel); outputs of 16 MiB and more are written with
// streaming stores.

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---- output rows: non-temporal (streaming) stores for large outputs -------------------------
// A normal store first reads the cache line it writes (read for ownership): 24 bytes of memory
// traffic per complex64 element instead of 16. For an output far larger than the caches, which
// the next operation reads from memory anyway, streaming stores skip that read.
constexpr int64_t kStreamBytes = int64_t{16} << 20;  // outputs from 16 MiB are streamed

// `narrow`: the source was just written with 16-byte stores (a transposed tile), so it is read
// back 16 bytes at a time. A load wider than the stores that wrote its bytes waits for them to
// reach the cache, and `std::memcpy` of such a 64-byte row did that (glibc's AVX-512 copy): the
// bfloat16 transpose of a (39,200, 96) array took 9.5 ms instead of 1.05 ms, single-threaded, on
// a 2-core Intel Xeon (AVX-512 FP16, AMX; 2026-11-29). The scans' state rows are written by
// compiler-vectorised loops and keep `std::memcpy`: 16-byte copies there made no step faster.
inline void CopyRow(void* dst, const void* src, size_t bytes, bool stream, bool narrow = false) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t i = 0;
#if defined(__SSE2__)
  if (stream) {
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    if (head <= bytes) {
      std::memcpy(d, s, head);
      for (i = head; i + 16 <= bytes; i += 16) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
      }
      std::memcpy(d + i, s + i, bytes - i);
      return;
    }
  }
  if (narrow) {
    for (; i + 16 <= bytes; i += 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
  }
#endif
  (void)stream;
  (void)narrow;
  std::memcpy(d + i, s + i, bytes - i);
}

// float32 → bfloat16 (the upper 16 bits) rounded to nearest, ties to even, a NaN kept a quiet
// NaN, subnormals kept: the conversion XLA's own convert makes (`x.astype(jnp.bfloat16)`), so a
// kernel's bfloat16 copy of its float32 output has the bits that convert would give
// (tests/test_scan_native.py checks them). A plain loop over a row; the compiler vectorises it.
// (AVX512_BF16's VCVTNEPS2BF16 flushes subnormals to zero, so it is not used.)
inline void ToBfloat16(uint16_t* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
  }
}

// n results from `src` into an output row of R (copied) or of bfloat16 (converted through `tmp`,
// n elements of scratch), with streaming stores where `stream`.
template <typename R>
inline void PutRow(R* dst, const R* src, int64_t n, bool stream, uint16_t* /*tmp*/) {
  CopyRow(dst, src, static_cast<size_t>(n) * sizeof(R), stream);
}

inline void PutRow(uint16_t* dst, const float* src, int64_t n, bool stream, uint16_t* tmp) {
  ToBfloat16(tmp, src, n);
  CopyRow(dst, tmp, static_cast<size_t>(n) * sizeof(uint16_t), stream);
}

inline void StreamFence(bool stream) {
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}

// Prefetch the bytes [begin, begin + bytes) a cache line at a time (a hint; no effect on values).
// On x86 as an asm statement: GCC's vectoriser drops `__builtin_prefetch` calls from a loop it
// vectorises (GCC 12 removed every prefetch of a look-ahead written as a small helper here,
// seen in the disassembly), and an asm statement it keeps.
// kL2: into the level-2 cache only (PREFETCHT1), for the planar adjoints (PrefetchL2).
template <bool kL2 = false>
inline void Prefetch(const void* begin, size_t bytes) {
  const char* p = static_cast<const char*>(begin);
  for (size_t i = 0; i < bytes; i += 64) {
#if defined(__x86_64__) || defined(__i386__)
    if constexpr (kL2) {
      asm volatile("prefetcht1 %0" : : "m"(p[i]));
    } else {
      asm volatile("prefetcht0 %0" : : "m"(p[i]));
    }
#else
    __builtin_prefetch(p + i, 0, kL2 ? 2 : 3);
#endif
  }
}

// The planar adjoints' look-aheads (PrefetchRowL2, PlanarAdjointBidirectional). The
// bidirectional one fetches a whole chunk of rows ahead (kAdjointChunk rows of g and x, 96-128
// KiB at P 96-128), and into L1 (32 KiB on the hosts seen) those lines evicted the rows the
// current chunk was still reading.
inline void PrefetchL2(const void* begin, size_t bytes) { Prefetch<true>(begin, bytes); }

// Loops that run back in time (a one-direction adjoint, a reverse-time forward pass) walk each
// sequence from its last row to its first, reading and writing rows of a few hundred bytes: the
// hardware prefetchers left those descending streams mostly unfetched. Each such step prefetches
// the rows that the step kAhead further on reads (g and x, or b; per-step a). On a 2-core AMD
// EPYC (Zen 5, AVX-512, 2026-12-02) the planar adjoint of (50, 784) sequences of P 64 lanes
// (sMNIST's layer) took 1.03-1.48 ms against 3.73-5.11 ms without (alternating builds, a /tmp
// script; 4 and 16 steps ahead: 1.58-1.60). Loops forward in time are left to the hardware.
constexpr int64_t kAhead = 8;

// Prefetch row `k` (of `bytes`) of an array of rows `stride` elements apart, if 0 <= k < L.
template <typename R>
inline void PrefetchRow(const R* rows, int64_t k, int64_t L, int64_t stride, size_t bytes) {
  if (k >= 0 && k < L) Prefetch(rows + k * stride, bytes);
}

// The same into L2 (PrefetchL2). The one-direction planar adjoint's look-ahead: at sMNIST's
// shape (50 × 784 steps, P 64) it took 2.12-3.28 ms (fastest of 30) against 3.71-5.67 ms with
// PrefetchRow; (4 × 1,024, P 192) 0.90-1.78 against 1.09-2.55 (2-core AMD EPYC Zen 4, 1 and 2
// threads, both hints in one process, 2026-12-03, a /tmp script). The forward passes' look-aheads
// measured no gain from it (Speech's and Text's bidirectional shapes, sMNIST's) and keep L1.
template <typename R>
inline void PrefetchRowL2(const R* rows, int64_t k, int64_t L, int64_t stride, size_t bytes) {
  if (k >= 0 && k < L) PrefetchL2(rows + k * stride, bytes);
}

// The same for rows about to be written (PREFETCHW where the build has it: the line arrives
// ready to be modified). A loop back in time writes its output rows in descending order: the
// reverse-time half of a bidirectional planar forward pass (batch 1, L 8,000, P 64, one
// thread) took 2.0-3.7x as long as its forward half without it, 1.5-2.5x with it (2-core
// AMD EPYC Zen 4, 2026-12-03, alternating builds). In the planar adjoints and the complex
// kernels it measured no gain and is not used. Not for streamed outputs (stores that bypass
// the cache).
template <typename R>
inline void PrefetchWriteRow(R* rows, int64_t k, int64_t L, int64_t stride, size_t bytes) {
  if (k < 0 || k >= L) return;
  const char* p = reinterpret_cast<const char*>(rows + k * stride);
  for (size_t i = 0; i < bytes; i += 64) {
#if defined(__PRFCHW__)
    asm volatile("prefetchw %0" : : "m"(p[i]));
#elif defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(p[i]));
#else
    __builtin_prefetch(p + i, 1);
#endif
  }
}

// ---- sequences split over threads -------------------------------------------------------------
int Threads(int64_t N, int64_t elements, int64_t per_thread = int64_t{1} << 18) {
  int avail = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) avail = CPU_COUNT(&set);
#endif
  if (const char* env = std::getenv("S5JAX_NATIVE_THREADS")) {
    const int v = std::atoi(env);
    if (v > 0) avail = v;
  }
  const int64_t by_work = std::max<int64_t>(1, elements / per_thread);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({avail, N, by_work})));
}

// The thread pool XLA runs its CPU thunks on, for the kernel now running on this thread (set by
// each handler for the duration of its call; null outside one).
thread_local ffi::ThreadPool* tl_pool = nullptr;

struct PoolScope {
  explicit PoolScope(ffi::ThreadPool* pool) : prev(tl_pool) { tl_pool = pool; }
  ~PoolScope() { tl_pool = prev; }
  ffi::ThreadPool* prev;
};

// Units are handed out dynamically: the calling thread and T − 1 helpers each claim the next
// chunk of units from a shared counter until none are left, and the call returns once every
// claimed chunk is done. The helpers are tasks on XLA's own thread pool (the one that runs the
// CPU thunks), not threads of their own: XLA runs independent thunks concurrently, and a kernel
// thread of its own then competes for the cores with XLA's workers, which also spin while they
// wait for work. With a static split over threads of its own, Speech's bfloat16 step (batch 1)
// took 62 ms in some processes and 76 ms in others, the native calls 0.8 against 2.3 ms (2-core
// AMD EPYC, 2026-11-29). A helper task that starts late (its worker busy with another thunk)
// finds the units taken and returns without touching the buffers; the shared state outlives the
// call for it. Without XLA's pool (tl_pool null), helpers are threads joined at the end.
template <typename F>
void ParallelOver(int64_t N, int64_t elements, F body,  // body(n_begin, n_end)
                  int64_t per_thread = int64_t{1} << 18) {
  const int T = Threads(N, elements, per_thread);
  if (T <= 1) {
    body(int64_t{0}, N);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
    int64_t N = 0, chunk = 1;
    std::function<void(int64_t, int64_t)> body;
  };
  auto shared = std::make_shared<Shared>();
  shared->N = N;
  shared->chunk = std::max<int64_t>(1, N / (int64_t{8} * T));
  shared->body = body;
  auto work = [](Shared& s) {
    for (int64_t u0 = s.next.fetch_add(s.chunk); u0 < s.N; u0 = s.next.fetch_add(s.chunk)) {
      const int64_t u1 = std::min(s.N, u0 + s.chunk);
      s.body(u0, u1);
      s.done.fetch_add(u1 - u0, std::memory_order_release);
    }
  };
  std::vector<std::thread> threads;
  if (tl_pool != nullptr) {
    for (int t = 1; t < T; ++t) tl_pool->Schedule([shared, work]() { work(*shared); });
  } else {
    threads.reserve(static_cast<size_t>(T - 1));
    for (int t = 1; t < T; ++t) threads.emplace_back([shared, work]() { work(*shared); });
  }
  work(*shared);
  while (shared->done.load(std::memory_order_acquire) < N) std::this_thread::yield();
  for (auto& th : threads) th.join();
}

// ---- real scalars -----------------------------------------------------------------------------
// Rows of P lanes. The state row s lives in a small buffer; each new row is computed there and
// copied to the output.

template <typename R>
struct RealRows {
  static constexpr int64_t kWidth = 1;  // scalars per lane
  using Acc = double;
  // s = a ⊙ s + b over one row
  static inline void Step(R* s, const R* a, const R* b, int64_t P, const R*, const R*) {
    for (int64_t p = 0; p < P; ++p) s[p] = a[p] * s[p] + b[p];
  }
  static inline void Prepare(const R*, int64_t, R*, R*) {}
  static inline void Product(R* out, const R* s, const R* x, int64_t P) {
    for (int64_t p = 0; p < P; ++p) out[p] = s[p] * x[p];
  }
};

// ---- complex scalars, stored interleaved (re, im) -----------------------------------------------
// With the coefficients duplicated, ar = (Re a, Re a) and ai = (−Im a, Im a) per lane, one step is
//   s[j] ← ar[j]·s[j] + ai[j]·s[j^1] + b[j]
// over 2P scalars: two multiply-adds and a swap of neighbours, which vectorises without
// de-interleaving (twice as fast as the textbook (re, im) pairs on the CPUs we measured).
template <typename R>
struct ComplexRows {
  static constexpr int64_t kWidth = 2;
  static inline void Prepare(const R* a, int64_t P, R* ar, R* ai) {
    for (int64_t p = 0; p < P; ++p) {
      ar[2 * p] = ar[2 * p + 1] = a[2 * p];
      ai[2 * p] = -a[2 * p + 1];
      ai[2 * p + 1] = a[2 * p + 1];
    }
  }
  static inline void Step(R* s, const R*, const R* b, int64_t P, const R* ar, const R* ai) {
    const int64_t Q = 2 * P;
    for (int64_t j = 0; j < Q; j += 2) {
      const R s0 = s[j], s1 = s[j + 1];
      s[j] = ar[j] * s0 + ai[j] * s1 + b[j];
      s[j + 1] = ar[j + 1] * s1 + ai[j + 1] * s0 + b[j + 1];
    }
  }
  static inline void Product(R* out, const R* s, const R* x, int64_t P) {  // s ⊙ x
    const int64_t Q = 2 * P;
    for (int64_t j = 0; j < Q; j += 2) {
      const R s0 = s[j], s1 = s[j + 1], x0 = x[j], x1 = x[j + 1];
      out[j] = s0 * x0 - s1 * x1;
      out[j + 1] = s0 * x1 + s1 * x0;
    }
  }
};

template <typename R>
struct RowsFor;
template <>
struct RowsFor<float> {
  using Scalar = float;
  using Rows = RealRows<float>;
};
template <>
struct RowsFor<double> {
  using Scalar = double;
  using Rows = RealRows<double>;
};
template <>
struct RowsFor<std::complex<float>> {
  using Scalar = float;
  using Rows = ComplexRows<float>;
};
template <>
struct RowsFor<std::complex<double>> {
  using Scalar = double;
  using Rows = ComplexRows<double>;
};

// x_k = a_k x_{k∓1} + b_k over N sequences of L rows of P lanes (T is the element type).
template <typename T>
void Forward(const T* a_in, const T* b_in, T* x_out, int64_t N, int64_t L, int64_t P,
             bool per_step, bool reverse) {
  using R = typename RowsFor<T>::Scalar;
  using Rows = typename RowsFor<T>::Rows;
  const int64_t Q = Rows::kWidth * P;  // scalars per row
  const bool stream = N * L * Q * static_cast<int64_t>(sizeof(R)) >= kStreamBytes;
  const R* a = reinterpret_cast<const R*>(a_in);
  const R* b = reinterpret_cast<const R*>(b_in);
  R* x = reinterpret_cast<R*>(x_out);
  ParallelOver(N, N * L * P, [=](int64_t n0, int64_t n1) {
    std::vector<R> s(static_cast<size_t>(Q)), ar(static_cast<size_t>(Q)), ai(static_cast<size_t>(Q));
    for (int64_t n = n0; n < n1; ++n) {
      const R* an = a + (per_step ? n * L * Q : n * Q);
      std::fill(s.begin(), s.end(), R(0));
      if (!per_step) Rows::Prepare(an, P, ar.data(), ai.data());
      for (int64_t i = 0; i < L; ++i) {
        const int64_t k = reverse ? L - 1 - i : i;
        if (reverse) {  // back in time: the rows of the step kAhead further on (k − kAhead)
          const size_t bytes = static_cast<size_t>(Q) * sizeof(R);
          PrefetchRow(b + n * L * Q, k - kAhead, L, Q, bytes);
          if (per_step) PrefetchRow(an, k - kAhead, L, Q, bytes);
        }
        const R* ak = per_step ? an + k * Q : an;
        if (per_step) Rows::Prepare(ak, P, ar.data(), ai.data());
        Rows::Step(s.data(), ak, b + (n * L + k) * Q, P, ar.data(), ai.data());
        CopyRow(x + (n * L + k) * Q, s.data(), static_cast<size_t>(Q) * sizeof(R), stream);
      }
    }
    StreamFence(stream);
  });
}

// The adjoint (see the top of the file): λ (b̄) for every step, and ā.
template <typename T>
void Adjoint(const T* a_in, const T* g_in, const T* x_in, T* lam_out, T* a_bar_out, int64_t N,
             int64_t L, int64_t P, bool per_step, bool reverse) {
  using R = typename RowsFor<T>::Scalar;
  using Rows = typename RowsFor<T>::Rows;
  const int64_t Q = Rows::kWidth * P;
  const bool stream = N * L * Q * static_cast<int64_t>(sizeof(R)) >= kStreamBytes;
  const R* a = reinterpret_cast<const R*>(a_in);
  const R* g = reinterpret_cast<const R*>(g_in);
  const R* x = reinterpret_cast<const R*>(x_in);
  R* lam = reinterpret_cast<R*>(lam_out);
  R* a_bar = reinterpret_cast<R*>(a_bar_out);
  constexpr int64_t kFlush = 256;  // steps summed in R before adding into the double sum
  ParallelOver(N, N * L * P, [=](int64_t n0, int64_t n1) {
    std::vector<R> s(static_cast<size_t>(Q)), ar(static_cast<size_t>(Q)), ai(static_cast<size_t>(Q));
    std::vector<R> prod(static_cast<size_t>(Q)), part(static_cast<size_t>(Q));
    std::vector<double> total(static_cast<size_t>(Q));
    for (int64_t n = n0; n < n1; ++n) {
      const R* an = a + (per_step ? n * L * Q : n * Q);
      R* abn = a_bar + (per_step ? n * L * Q : n * Q);
      std::fill(s.begin(), s.end(), R(0));
      std::fill(part.begin(), part.end(), R(0));
      std::fill(total.begin(), total.end(), 0.0);
      if (!per_step) Rows::Prepare(an, P, ar.data(), ai.data());
      // Opposite to the forward recurrence: from its last step to its first.
      for (int64_t i = 0; i < L; ++i) {
        const int64_t k = reverse ? i : L - 1 - i;
        const int64_t next = reverse ? k - 1 : k + 1;  // the step the forward pass took after k
        const int64_t prev = reverse ? k + 1 : k - 1;  // the step it took before k
        const bool has_prev = reverse ? k < L - 1 : k > 0;
        const R* gk = g + (n * L + k) * Q;
        if (!reverse) {  // back in time: the rows of the step kAhead further on (k − kAhead)
          const size_t bytes = static_cast<size_t>(Q) * sizeof(R);
          PrefetchRow(g + n * L * Q, k - kAhead, L, Q, bytes);
          PrefetchRow(x + n * L * Q, k - kAhead - 1, L, Q, bytes);
          if (per_step) PrefetchRow(an, k - kAhead + 1, L, Q, bytes);
        }
        if (i == 0) {
          std::copy(gk, gk + Q, s.begin());
        } else {
          const R* a_next = per_step ? an + next * Q : an;
          if (per_step) Rows::Prepare(a_next, P, ar.data(), ai.data());
          Rows::Step(s.data(), a_next, gk, P, ar.data(), ai.data());
        }
        CopyRow(lam + (n * L + k) * Q, s.data(), static_cast<size_t>(Q) * sizeof(R), stream);
        if (per_step) {
          if (has_prev) {
            Rows::Product(prod.data(), s.data(), x + (n * L + prev) * Q, P);
          } else {
            std::fill(prod.begin(), prod.end(), R(0));
          }
          CopyRow(abn + k * Q, prod.data(), static_cast<size_t>(Q) * sizeof(R), stream);
        } else if (has_prev) {
          Rows::Product(prod.data(), s.data(), x + (n * L + prev) * Q, P);
          for (int64_t j = 0; j < Q; ++j) part[j] += prod[j];
          if ((i + 1) % kFlush == 0) {
            for (int64_t j = 0; j < Q; ++j) {
              total[j] += static_cast<double>(part[j]);
              part[j] = R(0);
            }
          }
        }
      }
      if (!per_step) {
        for (int64_t j = 0; j < Q; ++j) abn[j] = static_cast<R>(total[j] + static_cast<double>(part[j]));
      }
    }
    StreamFence(stream);
  });
}

// ---- planar complex states: rows [Re | Im] -----------------------------------------------------
// The SSM's products give B̃u as real rows [Re | Im] (2P) and take the states the same way, so a
// kernel on that layout saves the passes that pack them into complex arrays and back (and, in
// the backward pass, unpack the cotangents and add the two directions'). Time-invariant a only:
//   forward  x→_k = a ⊙ x→_{k−1} + b_k, and with `bidirectional` x←_k = a ⊙ x←_{k+1} + b_k
//            (the same b); output rows of D·2P reals: [Re x | Im x] (D = 1) or
//            [Re x→ | Re x← | Im x→ | Im x←] (D = 2), the order of the output weight's rows.
//   adjoint  with real cotangents (∂loss/∂Re, ∂loss/∂Im), per direction
//            λ_k = g_k + conj(a) ⊙ λ_{k+1} (k−1 for x←), b̄_k = Σ_d λ_{d,k},
//            ā = Σ_d Σ_k conj(x_{d,k−1}) ⊙ λ_{d,k} (x_{k+1} for x←), as the pair (∂/∂Re a, ∂/∂Im a).
// The lanes of Re and Im are separate rows, so the inner loops vectorise as they are.
// Mixed precision ("s5jax_planar_mixed", "s5jax_planar_adjoint_mixed"; float32 only): the
// forward pass also writes the states rounded to bfloat16 (x16), the operand of C̃'s bfloat16
// product, and the adjoint writes b̄ rounded to bfloat16 only, the operand of B̃'s gradient
// products. Each saves a convert pass over an array as large as the states (s5jax.core._mixed).
// Work units: (sequence, block of lanes). The lanes' recurrences are independent, so one
// sequence (e.g. batch 1) still splits over the threads, and each unit runs every direction of
// its lanes (their b̄ rows add up with no other thread touching them). Blocks are whole multiples
// of 16 lanes (64-byte cache lines of float32) but the last.
struct Lanes {
  int64_t blocks = 1;
  int64_t Begin(int64_t P, int64_t j) const {
    return j == blocks ? P : (P / 16) * j / blocks * 16;
  }
};

constexpr int64_t kPlanarPerThread = int64_t{1} << 16;

Lanes SplitLanes(int64_t N, int64_t P, int64_t elements) {
  Lanes lanes;
  const int T = Threads(N * std::max<int64_t>(1, P / 16), elements, kPlanarPerThread);
  // Whole sequences where there are at least as many as threads; else a sequence's lanes split
  // into one block a thread. (Up to four blocks a thread, for ParallelOver's balancing, made
  // each unit's run over L narrower and slower: Speech at batch 1, whole float32 training step
  // on a 2-core Intel Xeon, 135.6-140.5 ms against 125.2-126.1 ms; Pathfinder at batch 4,
  // 186.8-190.0 against 173.4-177.3 ms, alternating processes, 2026-11-29.)
  if (T > 1 && N < T) {
    lanes.blocks = std::min<int64_t>((T + N - 1) / N, std::max<int64_t>(1, P / 16));
  }
  return lanes;
}

// One step of each loop over a block of lanes, on separate (restrict) rows so that it
// vectorises without runtime alias checks.
template <typename R>
inline void PlanarStep(R* __restrict sr, R* __restrict si, const R* __restrict ar,
                       const R* __restrict ai, const R* __restrict br, const R* __restrict bi,
                       int64_t n, R sign) {  // s ← a s + b (sign 1), or conj(a) s + b (sign −1)
  for (int64_t p = 0; p < n; ++p) {
    const R re = sr[p], im = si[p], c = sign * ai[p];
    sr[p] = ar[p] * re - c * im + br[p];
    si[p] = ar[p] * im + c * re + bi[p];
  }
}

template <typename R>
inline void PlanarAccumulate(R* __restrict pr, R* __restrict pi, const R* __restrict xr,
                             const R* __restrict xi, const R* __restrict lr,
                             const R* __restrict li, int64_t n) {  // p += conj(x) λ
  for (int64_t q = 0; q < n; ++q) {
    pr[q] += xr[q] * lr[q] + xi[q] * li[q];
    pi[q] += xr[q] * li[q] - xi[q] * lr[q];
  }
}

template <typename R>
inline void PlanarAdd(R* __restrict out_r, R* __restrict out_i, const R* __restrict lr,
                      const R* __restrict li, int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    out_r[q] += lr[q];
    out_i[q] += li[q];
  }
}

template <typename R>
void PlanarForward(const R* a, const R* b, R* x, uint16_t* x16, int64_t N, int64_t L, int64_t P,
                   int64_t D) {  // x16: nullptr, or (float32 only) the states' bfloat16 copy
  const int64_t W = 2 * D * P;  // reals per output row
  const bool stream = N * L * W * static_cast<int64_t>(sizeof(R)) >= kStreamBytes;
  const bool stream16 = N * L * W * static_cast<int64_t>(sizeof(uint16_t)) >= kStreamBytes;
  const Lanes lanes = SplitLanes(N, P, N * L * P * D);
  ParallelOver(N * lanes.blocks, N * L * P * D, [=](int64_t u0, int64_t u1) {
    std::vector<R> s(static_cast<size_t>(2 * P));
    std::vector<uint16_t> tmp(x16 != nullptr ? static_cast<size_t>(P) : 0);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / lanes.blocks, j = u % lanes.blocks;
      const int64_t p0 = lanes.Begin(P, j), Pj = lanes.Begin(P, j + 1) - p0;
      const size_t row = static_cast<size_t>(Pj) * sizeof(R);
      R* sr = s.data();
      R* si = sr + Pj;
      const R* ar = a + n * 2 * P + p0;
      const R* ai = ar + P;
      for (int64_t d = 0; d < D; ++d) {
        std::fill(s.begin(), s.end(), R(0));
        for (int64_t i = 0; i < L; ++i) {
          const int64_t k = d == 0 ? i : L - 1 - i;
          if (d == 1) {  // back in time: the rows of the step kAhead further on (k − kAhead)
            PrefetchRow(b + n * L * 2 * P + p0, k - kAhead, L, 2 * P, row);
            PrefetchRow(b + n * L * 2 * P + p0 + P, k - kAhead, L, 2 * P, row);
            if (!stream) {  // the output rows it writes (PrefetchWriteRow)
              PrefetchWriteRow(x + n * L * W + p0 + P, k - kAhead, L, W, row);
              PrefetchWriteRow(x + n * L * W + p0 + 3 * P, k - kAhead, L, W, row);
            }
            if (x16 != nullptr && !stream16) {
              const size_t row16 = static_cast<size_t>(Pj) * sizeof(uint16_t);
              PrefetchWriteRow(x16 + n * L * W + p0 + P, k - kAhead, L, W, row16);
              PrefetchWriteRow(x16 + n * L * W + p0 + 3 * P, k - kAhead, L, W, row16);
            }
          }
          const R* br = b + (n * L + k) * 2 * P + p0;
          const R* bi = br + P;
          PlanarStep(sr, si, ar, ai, br, bi, Pj, R(1));
          R* out = x + (n * L + k) * W + p0;
          CopyRow(out + d * P, sr, row, stream);
          CopyRow(out + (D + d) * P, si, row, stream);
          if constexpr (std::is_same_v<R, float>) {
            if (x16 != nullptr) {
              uint16_t* out16 = x16 + (n * L + k) * W + p0;
              PutRow(out16 + d * P, sr, Pj, stream16, tmp.data());
              PutRow(out16 + (D + d) * P, si, Pj, stream16, tmp.data());
            }
          }
        }
      }
    }
    StreamFence(stream || (x16 != nullptr && stream16));
  }, kPlanarPerThread);
}

// ā of one block of lanes: the double sums (Re over Pj lanes, then Im) into the (Re | Im)
// halves of a row of 2P.
template <typename R>
inline void StoreABar(R* abn, const std::vector<double>& total, int64_t Pj, int64_t P) {
  for (int64_t p = 0; p < Pj; ++p) {
    abn[p] = static_cast<R>(total[static_cast<size_t>(p)]);
    abn[P + p] = static_cast<R>(total[static_cast<size_t>(Pj + p)]);
  }
}

// The two directions' adjoints run opposite ways in time (x→'s from the last step, x←'s from
// the first) and both add into every b̄ row. Run one after the other (this kernel before
// 2026-12-01), the first writes b̄ and the second reads it back and adds, and each reads half of
// every g and x row (its direction's quarters) with a stride of a whole row: the hardware
// prefetchers see two rows a 4 KiB page and fall behind. Here λ← is first run over the whole
// sequence once, keeping only its value before each chunk of kAdjointChunk steps; then the
// chunks are taken from the last: λ← is recomputed over the chunk from its kept value (forward
// in time, its rows kept in a small buffer), λ→ runs back over it, and each b̄ row is written
// once (λ→ + λ←, streamed when large), while the next chunk's rows of g and x are prefetched.
// Both passes over a chunk read its g and x rows from the caches. In the layer benchmark's
// float32 step (8 × 4096 steps, P 128) the call took 27.1-28.1 ms against 30.8-33.6 ms for the
// two passes one after the other (2-core AMD EPYC with AVX2 only, 2026-12-01, jax.profiler,
// old and new code in alternating processes; docs/results.md).
// The look-aheads go to L2 (PrefetchL2): the next chunk's g rows while λ← runs over this one,
// its x rows while λ→ does, and the first pass's g rows kAhead steps on (it had none). With the
// whole next chunk fetched into L1 from the λ← loop (before 2026-12-03) the call at Text's shape
// (4 × 4,096 steps, P 96, 2 threads) took 5.8-6.7 ms (fastest of 15) against 4.2-4.7 ms now;
// Path-X's (1 × 4,096, P 128) 2.6-2.9 against 1.9-2.4 (2-core AMD EPYC Zen 4, AVX-512,
// `benchmarks/planar_scan.py` in alternating processes, three rounds; docs/results.md).
constexpr int64_t kAdjointChunk = 32;

template <typename R, typename O>  // O: b̄'s element type, R or (R float) bfloat16 as uint16_t
void PlanarAdjointBidirectional(const R* a, const R* g, const R* x, O* b_bar, R* a_bar, int64_t N,
                                int64_t L, int64_t P) {
  const int64_t W = 4 * P, C = kAdjointChunk, chunks = (L + C - 1) / C;
  const bool stream = N * L * 2 * P * static_cast<int64_t>(sizeof(O)) >= kStreamBytes;
  const Lanes lanes = SplitLanes(N, P, N * L * P * 2);
  ParallelOver(N * lanes.blocks, N * L * P * 2, [=](int64_t u0, int64_t u1) {
    std::vector<R> fwd(static_cast<size_t>(2 * P)), bwd(static_cast<size_t>(2 * P));
    std::vector<R> part(static_cast<size_t>(4 * P)), rows(static_cast<size_t>(2 * P * C));
    std::vector<R> kept(static_cast<size_t>(2 * P * chunks));
    std::vector<double> total(static_cast<size_t>(2 * P));
    std::vector<uint16_t> tmp(static_cast<size_t>(P));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / lanes.blocks, j = u % lanes.blocks;
      const int64_t p0 = lanes.Begin(P, j), Pj = lanes.Begin(P, j + 1) - p0;
      const size_t row = static_cast<size_t>(Pj) * sizeof(R);
      const R* ar = a + n * 2 * P + p0;
      const R* ai = ar + P;
      const R* gn = g + n * L * W + p0;  // + k·W + q·P: quarter q (Re→, Re←, Im→, Im←) of row k
      const R* xn = x + n * L * W + p0;
      O* bn = b_bar + n * L * 2 * P + p0;
      R *fr = fwd.data(), *fi = fr + Pj, *br = bwd.data(), *bi = br + Pj;
      R *pfr = part.data(), *pfi = pfr + Pj, *pbr = pfi + Pj, *pbi = pbr + Pj;
      // λ←_k = g←_k + conj(a) λ←_{k−1}, from the first step; its value before each chunk kept.
      std::fill(bwd.begin(), bwd.end(), R(0));
      for (int64_t k = 0; k < L; ++k) {
        if (k % C == 0) std::copy(br, br + 2 * Pj, kept.begin() + (k / C) * 2 * Pj);
        PrefetchRowL2(gn + P, k + kAhead, L, W, row);  // g's quarters Re← and Im←, kAhead on
        PrefetchRowL2(gn + 3 * P, k + kAhead, L, W, row);
        PlanarStep(br, bi, ar, ai, gn + k * W + P, gn + k * W + 3 * P, Pj, R(-1));
      }
      std::fill(fwd.begin(), fwd.end(), R(0));
      std::fill(part.begin(), part.end(), R(0));
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t k0 = c * C, k1 = std::min(L, k0 + C);
        std::copy(kept.begin() + c * 2 * Pj, kept.begin() + (c + 1) * 2 * Pj, br);
        for (int64_t k = k0; k < k1; ++k) {  // λ← over the chunk, forward in time
          if (c > 0) {  // g's same row of the next chunk to run (the one before this)
            for (int64_t q = 0; q < 4; ++q) PrefetchL2(gn + (k - C) * W + q * P, row);
          }
          PlanarStep(br, bi, ar, ai, gn + k * W + P, gn + k * W + 3 * P, Pj, R(-1));
          std::copy(br, br + 2 * Pj, rows.begin() + (k - k0) * 2 * Pj);
          if (k + 1 < L) {  // ā← += conj(x←_{k+1}) λ←_k
            PlanarAccumulate(pbr, pbi, xn + (k + 1) * W + P, xn + (k + 1) * W + 3 * P, br, bi, Pj);
          }
        }
        for (int64_t k = k1 - 1; k >= k0; --k) {  // λ→ back over the chunk; b̄ rows written
          if (c > 0) {  // and x's
            for (int64_t q = 0; q < 4; ++q) PrefetchL2(xn + (k - C) * W + q * P, row);
          }
          PlanarStep(fr, fi, ar, ai, gn + k * W, gn + k * W + 2 * P, Pj, R(-1));
          R* sum = rows.data() + (k - k0) * 2 * Pj;  // λ← + λ→, then out
          PlanarAdd(sum, sum + Pj, fr, fi, Pj);
          PutRow(bn + k * 2 * P, sum, Pj, stream, tmp.data());
          PutRow(bn + k * 2 * P + P, sum + Pj, Pj, stream, tmp.data());
          if (k > 0) {  // ā→ += conj(x→_{k−1}) λ→_k
            PlanarAccumulate(pfr, pfi, xn + (k - 1) * W, xn + (k - 1) * W + 2 * P, fr, fi, Pj);
          }
        }
        for (int64_t q = 0; q < 2 * Pj; ++q) {  // each chunk's sums into double
          total[static_cast<size_t>(q)] += static_cast<double>(part[static_cast<size_t>(q)]) +
                                           static_cast<double>(part[static_cast<size_t>(2 * Pj + q)]);
        }
        std::fill(part.begin(), part.end(), R(0));
      }
      StoreABar(a_bar + n * 2 * P + p0, total, Pj, P);
    }
    StreamFence(stream);
  }, kPlanarPerThread);
}

// One direction (D = 1): λ from the last step back, b̄ rows streamed when large. D = 2 goes to
// PlanarAdjointBidirectional.
template <typename R, typename O>
void PlanarAdjoint(const R* a, const R* g, const R* x, O* b_bar, R* a_bar, int64_t N, int64_t L,
                   int64_t P, int64_t D) {
  if (D == 2) {
    PlanarAdjointBidirectional(a, g, x, b_bar, a_bar, N, L, P);
    return;
  }
  const int64_t W = 2 * P;
  const bool stream = N * L * 2 * P * static_cast<int64_t>(sizeof(O)) >= kStreamBytes;
  constexpr int64_t kFlush = 256;  // steps summed in R before adding into the double sum
  const Lanes lanes = SplitLanes(N, P, N * L * P);
  ParallelOver(N * lanes.blocks, N * L * P, [=](int64_t u0, int64_t u1) {
    std::vector<R> s(static_cast<size_t>(2 * P)), part(static_cast<size_t>(2 * P));
    std::vector<double> total(static_cast<size_t>(2 * P));
    std::vector<uint16_t> tmp(static_cast<size_t>(P));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / lanes.blocks, j = u % lanes.blocks;
      const int64_t p0 = lanes.Begin(P, j), Pj = lanes.Begin(P, j + 1) - p0;
      const size_t row = static_cast<size_t>(Pj) * sizeof(R);
      R* lr = s.data();
      R* li = lr + Pj;
      R* pr = part.data();
      R* pi = pr + Pj;
      const R* ar = a + n * 2 * P + p0;
      const R* ai = ar + P;
      std::fill(total.begin(), total.end(), 0.0);
      std::fill(s.begin(), s.end(), R(0));
      std::fill(part.begin(), part.end(), R(0));
      for (int64_t i = 0; i < L; ++i) {  // opposite to the recurrence
        const int64_t k = L - 1 - i;
        const R* gr = g + (n * L + k) * W + p0;
        // The rows of the step kAhead further on (k − kAhead): g's and x's Re and Im parts.
        PrefetchRowL2(g + n * L * W + p0, k - kAhead, L, W, row);
        PrefetchRowL2(g + n * L * W + p0 + P, k - kAhead, L, W, row);
        PrefetchRowL2(x + n * L * W + p0, k - kAhead - 1, L, W, row);
        PrefetchRowL2(x + n * L * W + p0 + P, k - kAhead - 1, L, W, row);
        PlanarStep(lr, li, ar, ai, gr, gr + P, Pj, R(-1));  // λ ← g + conj(a) λ
        O* out = b_bar + (n * L + k) * 2 * P + p0;
        PutRow(out, lr, Pj, stream, tmp.data());
        PutRow(out + P, li, Pj, stream, tmp.data());
        if (k > 0) {
          const R* xr = x + (n * L + k - 1) * W + p0;
          PlanarAccumulate(pr, pi, xr, xr + P, lr, li, Pj);
        }
        if ((i + 1) % kFlush == 0) {
          for (int64_t q = 0; q < 2 * Pj; ++q) {
            total[static_cast<size_t>(q)] += static_cast<double>(part[static_cast<size_t>(q)]);
            part[static_cast<size_t>(q)] = R(0);
          }
        }
      }
      for (int64_t q = 0; q < 2 * Pj; ++q) {
        total[static_cast<size_t>(q)] += static_cast<double>(part[static_cast<size_t>(q)]);
      }
      StoreABar(a_bar + n * 2 * P + p0, total, Pj, P);
    }
    StreamFence(stream);
  }, kPlanarPerThread);
}

struct Shape {
  int64_t N = 1, L = 0, P = 0;
};

// b's dims give (N, L, P); a must hold N·P (time-invariant) or N·L·P (per step) elements.
ffi::Error GetShape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, bool per_step, Shape* out) {
  auto dims = b.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("s5jax_recurrence: b must be (..., L, P)");
  Shape s;
  s.P = dims[dims.size() - 1];
  s.L = dims[dims.size() - 2];
  for (size_t d = 0; d + 2 < dims.size(); ++d) s.N *= dims[d];
  const int64_t want = per_step ? s.N * s.L * s.P : s.N * s.P;
  if (static_cast<int64_t>(a.element_count()) != want) {
    return ffi::Error::InvalidArgument("s5jax_recurrence: a has " +
                                       std::to_string(a.element_count()) + " elements, expected " +
                                       std::to_string(want));
  }
  if (a.element_type() != b.element_type()) {
    return ffi::Error::InvalidArgument("s5jax_recurrence: a and b must share a dtype");
  }
  *out = s;
  return ffi::Error::Success();
}

template <typename T>
T* Data(const ffi::AnyBuffer& buf) {
  return static_cast<T*>(buf.untyped_data());
}

ffi::Error RecurrenceImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x,
                          bool per_step, bool reverse) {
  PoolScope scope(&pool);
  Shape s;
  if (auto err = GetShape(a, b, per_step, &s); !err.success()) return err;
  switch (b.element_type()) {
#define S5JAX_CASE(DT, T)                                                                   \
  case ffi::DataType::DT:                                                                   \
    Forward<T>(Data<T>(a), Data<T>(b), Data<T>(*x), s.N, s.L, s.P, per_step, reverse); \
    return ffi::Error::Success();
    S5JAX_CASE(F32, float)
    S5JAX_CASE(F64, double)
    S5JAX_CASE(C64, std::complex<float>)
    S5JAX_CASE(C128, std::complex<double>)
#undef S5JAX_CASE
    default:
      return ffi::Error::InvalidArgument(
          "s5jax_recurrence: dtype must be float32, float64, complex64 or complex128");
  }
}

ffi::Error AdjointImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer g, ffi::AnyBuffer x,
                       ffi::Result<ffi::AnyBuffer> lam, ffi::Result<ffi::AnyBuffer> a_bar,
                       bool per_step, bool reverse) {
  PoolScope scope(&pool);
  Shape s;
  if (auto err = GetShape(a, g, per_step, &s); !err.success()) return err;
  if (x.element_count() != g.element_count() || x.element_type() != g.element_type()) {
    return ffi::Error::InvalidArgument("s5jax_recurrence_adjoint: x and g must match");
  }
  switch (g.element_type()) {
#define S5JAX_CASE(DT, T)                                                                  \
  case ffi::DataType::DT:                                                                  \
    Adjoint<T>(Data<T>(a), Data<T>(g), Data<T>(x), Data<T>(*lam), Data<T>(*a_bar), s.N, \
               s.L, s.P, per_step, reverse);                                              \
    return ffi::Error::Success();
    S5JAX_CASE(F32, float)
    S5JAX_CASE(F64, double)
    S5JAX_CASE(C64, std::complex<float>)
    S5JAX_CASE(C128, std::complex<double>)
#undef S5JAX_CASE
    default:
      return ffi::Error::InvalidArgument(
          "s5jax_recurrence_adjoint: dtype must be float32, float64, complex64 or complex128");
  }
}

// b (N, L, 2P) real; a (N, 2P) of the same dtype; D directions.
ffi::Error GetPlanarShape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, Shape* out,
                          bool same_dtype = true) {
  auto dims = b.dimensions();
  if (dims.size() < 2 || dims[dims.size() - 1] % 2 != 0) {
    return ffi::Error::InvalidArgument("s5jax_planar: b must be (..., L, 2P)");
  }
  Shape s;
  s.P = dims[dims.size() - 1] / 2;
  s.L = dims[dims.size() - 2];
  for (size_t d = 0; d + 2 < dims.size(); ++d) s.N *= dims[d];
  if (static_cast<int64_t>(a.element_count()) != s.N * 2 * s.P) {
    return ffi::Error::InvalidArgument("s5jax_planar: a has " + std::to_string(a.element_count()) +
                                       " elements, expected " + std::to_string(s.N * 2 * s.P));
  }
  if (same_dtype && a.element_type() != b.element_type()) {
    return ffi::Error::InvalidArgument("s5jax_planar: a and b must share a dtype");
  }
  *out = s;
  return ffi::Error::Success();
}

// The planar forward pass; with `x16` (the mixed handler) float32 only, plus the bfloat16 copy.
ffi::Error PlanarRun(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, ffi::AnyBuffer& x,
                     ffi::AnyBuffer* x16, bool bidirectional) {
  Shape s;
  if (auto err = GetPlanarShape(a, b, &s); !err.success()) return err;
  const int64_t D = bidirectional ? 2 : 1;
  const auto want = static_cast<size_t>(s.N * s.L * 2 * D * s.P);
  if (x.element_count() != want || (x16 != nullptr && x16->element_count() != want)) {
    return ffi::Error::InvalidArgument("s5jax_planar: x must be (..., L, 2·D·P)");
  }
  if (x16 != nullptr) {
    if (b.element_type() != ffi::DataType::F32 || x16->element_type() != ffi::DataType::BF16) {
      return ffi::Error::InvalidArgument(
          "s5jax_planar_mixed: b must be float32 and the copy bfloat16");
    }
    PlanarForward<float>(Data<float>(a), Data<float>(b), Data<float>(x),
                         static_cast<uint16_t*>(x16->untyped_data()), s.N, s.L, s.P, D);
    return ffi::Error::Success();
  }
  switch (b.element_type()) {
    case ffi::DataType::F32:
      PlanarForward<float>(Data<float>(a), Data<float>(b), Data<float>(x), nullptr, s.N, s.L, s.P,
                           D);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      PlanarForward<double>(Data<double>(a), Data<double>(b), Data<double>(x), nullptr, s.N, s.L,
                            s.P, D);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("s5jax_planar: dtype must be float32 or float64");
  }
}

ffi::Error PlanarImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::Result<ffi::AnyBuffer> x, bool bidirectional) {
  PoolScope scope(&pool);
  return PlanarRun(a, b, *x, nullptr, bidirectional);
}

ffi::Error PlanarMixedImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::Result<ffi::AnyBuffer> x, ffi::Result<ffi::AnyBuffer> x16,
                           bool bidirectional) {
  PoolScope scope(&pool);
  return PlanarRun(a, b, *x, &*x16, bidirectional);
}

// The planar adjoint; b̄ in bfloat16 where `b_bar` is (the mixed handler, float32 only).
ffi::Error PlanarAdjointRun(const ffi::AnyBuffer& a, const ffi::AnyBuffer& g,
                            const ffi::AnyBuffer& x, ffi::AnyBuffer& b_bar, ffi::AnyBuffer& a_bar,
                            bool bidirectional) {
  Shape s;
  if (auto err = GetPlanarShape(a, b_bar, &s, false); !err.success()) return err;
  const int64_t D = bidirectional ? 2 : 1;
  const int64_t want = s.N * s.L * 2 * D * s.P;
  if (static_cast<int64_t>(g.element_count()) != want ||
      static_cast<int64_t>(x.element_count()) != want || g.element_type() != x.element_type() ||
      g.element_type() != a.element_type()) {
    return ffi::Error::InvalidArgument("s5jax_planar_adjoint: g and x must be (..., L, 2·D·P)");
  }
  const bool narrow = b_bar.element_type() == ffi::DataType::BF16;
  if (narrow && g.element_type() == ffi::DataType::F32) {
    PlanarAdjoint<float>(Data<float>(a), Data<float>(g), Data<float>(x),
                         static_cast<uint16_t*>(b_bar.untyped_data()), Data<float>(a_bar), s.N,
                         s.L, s.P, D);
    return ffi::Error::Success();
  }
  if (!narrow && b_bar.element_type() == g.element_type()) {
    switch (g.element_type()) {
      case ffi::DataType::F32:
        PlanarAdjoint<float>(Data<float>(a), Data<float>(g), Data<float>(x), Data<float>(b_bar),
                             Data<float>(a_bar), s.N, s.L, s.P, D);
        return ffi::Error::Success();
      case ffi::DataType::F64:
        PlanarAdjoint<double>(Data<double>(a), Data<double>(g), Data<double>(x),
                              Data<double>(b_bar), Data<double>(a_bar), s.N, s.L, s.P, D);
        return ffi::Error::Success();
      default:
        break;
    }
  }
  return ffi::Error::InvalidArgument(
      "s5jax_planar_adjoint: dtype must be float32 or float64 (b̄ in bfloat16: float32 only)");
}

ffi::Error PlanarAdjointImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer g,
                             ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> b_bar,
                             ffi::Result<ffi::AnyBuffer> a_bar, bool bidirectional) {
  PoolScope scope(&pool);
  return PlanarAdjointRun(a, g, x, *b_bar, *a_bar, bidirectional);
}

// The materialisation barrier: y = x. XLA aliases y to x (input_output_aliases) when x has no
// other use, so this is a no-op; otherwise it hands a separate buffer and the copy is made here.
// Its point is that XLA cannot fuse through a custom call: x is written to memory once and read
// from there, instead of being recomputed inside every fusion that consumes it.
ffi::Error MaterialiseImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (y->untyped_data() != x.untyped_data()) {
    std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  }
  return ffi::Error::Success();
}

// Transpose of the last two axes, (..., R, C) -> (..., C, R), for 2-, 4- and 8-byte elements:
// the weight gradient's left operand (s5jax.core._products). XLA's CPU backend fuses such a
// transpose into its consumer or into a loop over the elements; a custom call stores it once,
// row-major, which the bfloat16 matrix-product kernels take as it is. Tiles of 32 × 32 elements
// (a few KiB, in L1) are copied in blocks of SSE2 unpacks; tile rows are claimed by the threads.
// A full kB × kB block: dst[c * R + r] = src[r * C + c] for r, c < kB. SSE2 unpacks where the
// element size has them (8 × 8 of 16-bit, 4 × 4 of 32-bit elements), element by element else.
template <typename E>
struct Blocks {
  static constexpr int64_t kB = 8;
  static inline void Full(const E* src, int64_t C, E* dst, int64_t R) {
    for (int64_t c = 0; c < kB; ++c) {
      for (int64_t r = 0; r < kB; ++r) dst[c * R + r] = src[r * C + c];
    }
  }
};

#if defined(__SSE2__)
template <>
struct Blocks<uint16_t> {
  static constexpr int64_t kB = 8;
  static inline void Full(const uint16_t* src, int64_t C, uint16_t* dst, int64_t R) {
    __m128i r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * C));
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    // u0..u3: columns (0,1) (2,3) (4,5) (6,7) of rows 0-3; u4..u7 the same of rows 4-7.
    u[0] = _mm_unpacklo_epi32(t[0], t[2]);
    u[1] = _mm_unpackhi_epi32(t[0], t[2]);
    u[2] = _mm_unpacklo_epi32(t[1], t[3]);
    u[3] = _mm_unpackhi_epi32(t[1], t[3]);
    u[4] = _mm_unpacklo_epi32(t[4], t[6]);
    u[5] = _mm_unpackhi_epi32(t[4], t[6]);
    u[6] = _mm_unpacklo_epi32(t[5], t[7]);
    u[7] = _mm_unpackhi_epi32(t[5], t[7]);
    for (int i = 0; i < 4; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * i) * R),
                       _mm_unpacklo_epi64(u[i], u[i + 4]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * i + 1) * R),
                       _mm_unpackhi_epi64(u[i], u[i + 4]));
    }
  }
};

template <>
struct Blocks<uint32_t> {
  static constexpr int64_t kB = 4;
  static inline void Full(const uint32_t* src, int64_t C, uint32_t* dst, int64_t R) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + C));
    const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * C));
    const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * C));
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
    const __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi64(t0, t2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + R), _mm_unpackhi_epi64(t0, t2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * R), _mm_unpacklo_epi64(t1, t3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * R), _mm_unpackhi_epi64(t1, t3));
  }
};
#endif

// The transpose's output is read once, by the matrix product that follows, which packs it anyway:
// it is streamed from 4 MiB, not from kStreamBytes. On the 2-core Intel Xeon (2026-11-29) the
// sequential-MNIST bfloat16 training step (13 transposes of 7.5-10 MiB) took 232-236 ms with
// them streamed against 246-257 ms with normal stores, the transposes 1.0-1.8 against 1.8-4.1 ms
// each; not re-measured on AMD EPYC, where the 16 MiB threshold was chosen.
constexpr int64_t kTransposeStreamBytes = int64_t{4} << 20;

template <typename E>
void TransposeTiles(const E* in, E* out, int64_t N, int64_t R, int64_t C) {
  constexpr int64_t kTile = 32;
  constexpr int64_t kB = Blocks<E>::kB;
  const int64_t row_tiles = (R + kTile - 1) / kTile;
  const bool stream = N * R * C * static_cast<int64_t>(sizeof(E)) >= kTransposeStreamBytes;
  ParallelOver(N * row_tiles, N * R * C, [=](int64_t u0, int64_t u1) {
    alignas(64) E buf[kTile * kTile];  // one tile, transposed: buf[c * kTile + r]
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / row_tiles, r0 = (u % row_tiles) * kTile;
      const int64_t rows = std::min(R, r0 + kTile) - r0;
      const E* src = in + n * R * C + r0 * C;
      E* dst = out + n * R * C + r0;
      // The next row tile's input (contiguous), a slice per column tile, fetched ahead: this
      // tile reads 64 bytes of each of its rows per column tile, a pattern the hardware
      // prefetchers follow poorly. On a 2-core Zen 4 AMD EPYC (2026-12-02, alternating builds,
      // a /tmp script, medians of 31 calls) a bfloat16 (32,768, 512) transpose took 5.3-5.4 ms
      // against 8.6-9.5, float32 11.7-12.9 against 18.8-19.0, bfloat16 (8, 4,096, 256) 1.4-2.0
      // against 4.1-4.6. Whole bfloat16 steps through the transposed copy (the bfloat16
      // weight-gradient tile switched off, as on AMX hosts) moved less: Text 720-733 against
      // 741-761 ms, Image and sMNIST within noise (benchmarks/train_step.py, two pairs).
      const int64_t next_rows = std::max<int64_t>(0, std::min(R, r0 + 2 * kTile) - (r0 + kTile));
      const size_t next_bytes = static_cast<size_t>(next_rows * C) * sizeof(E);
      const size_t col_tiles = static_cast<size_t>((C + kTile - 1) / kTile);
      const size_t slice = (next_bytes / col_tiles + 63) / 64 * 64;
      const char* next = next_rows > 0 ? reinterpret_cast<const char*>(src + kTile * C) : nullptr;
      for (int64_t c0 = 0; c0 < C; c0 += kTile) {
        const int64_t cols = std::min(C, c0 + kTile) - c0;
        const size_t from = static_cast<size_t>(c0 / kTile) * slice;
        if (from < next_bytes) Prefetch(next + from, std::min(slice, next_bytes - from));
        for (int64_t rb = 0; rb < rows; rb += kB) {
          for (int64_t cb = 0; cb < cols; cb += kB) {
            if (rb + kB <= rows && cb + kB <= cols) {
              Blocks<E>::Full(src + rb * C + c0 + cb, C, buf + cb * kTile + rb, kTile);
              continue;
            }
            const int64_t re = std::min(rows, rb + kB), ce = std::min(cols, cb + kB);
            for (int64_t c = cb; c < ce; ++c) {
              for (int64_t r = rb; r < re; ++r) buf[c * kTile + r] = src[r * C + c0 + c];
            }
          }
        }
        for (int64_t c = 0; c < cols; ++c) {  // whole output lines from the tile
          CopyRow(dst + (c0 + c) * R, buf + c * kTile, static_cast<size_t>(rows) * sizeof(E),
                  stream, /*narrow=*/true);
        }
      }
    }
    StreamFence(stream);
  }, int64_t{1} << 17);
}

ffi::Error TransposeImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  PoolScope scope(&pool);
  auto dims = x.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("s5jax_transpose: x must be (..., R, C)");
  const int64_t R = dims[dims.size() - 2], C = dims[dims.size() - 1];
  int64_t N = 1;
  for (size_t d = 0; d + 2 < dims.size(); ++d) N *= dims[d];
  if (y->element_count() != x.element_count() || y->element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument("s5jax_transpose: y must be x's (..., C, R)");
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  const size_t bytes = x.size_bytes() / x.element_count();
  switch (bytes) {
    case 2:
      TransposeTiles(static_cast<const uint16_t*>(x.untyped_data()),
                     static_cast<uint16_t*>(y->untyped_data()), N, R, C);
      return ffi::Error::Success();
    case 4:
      TransposeTiles(static_cast<const uint32_t*>(x.untyped_data()),
                     static_cast<uint32_t*>(y->untyped_data()), N, R, C);
      return ffi::Error::Success();
    case 8:
      TransposeTiles(static_cast<const uint64_t*>(x.untyped_data()),
                     static_cast<uint64_t*>(y->untyped_data()), N, R, C);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("s5jax_transpose: elements must be 2, 4 or 8 bytes");
  }
}

// ---- weight gradient: c = Σ_r a[r]ᵀ g[r], float32 (and bfloat16 operands, below) ---------------
// The gradient of a weight W in y = x W over all rows of a batch: a (R, K) the rows x, g (R, N)
// the rows ∂y, c (K, N). XLA's CPU backend runs this product (the contracted axis is the outer
// one of both operands) at 55-60 GFLOP/s on a 2-core AMD EPYC with AVX2 (jax 0.10.2, YNNPACK or
// Eigen), against 95-125 for the forward products of the same sizes. Here rows are taken in
// chunks of kWgRows; each chunk of a is packed into panels of kWgMR columns and each chunk of g
// into panels of kWgNR (sequential reads: a strided walk down a column of a 2 KiB-wide row maps
// every line to the same few L1 sets), and a kWgMR × kWgNR tile of c is accumulated in vector
// registers over the chunk: 6 × 16 in 12 AVX2 registers, or, in a build with AVX-512, 12 × 32
// in 24 of its 32 registers (on a 2-core AMD EPYC with AVX-512, family 26, 2026-12-02, the AVX2
// tile ran at 150-190 GFLOP/s there, below XLA's 150-280). Blocks of rows are claimed by the
// calling thread and XLA's pool (ParallelOver); each block sums into its own partial c, and the
// partials are added at the end in block order, so the result does not depend on which thread
// ran which block.
constexpr int64_t kWgRows = 128;     // rows per packed chunk
constexpr int64_t kWgBlock = 2048;   // rows per block (one partial c each), at least
// At most this many floats of partial sums per batch element (8 MiB): with more rows the blocks
// grow instead (a (51,200, 512) × (…, 768) gradient would otherwise zero and add 25 partials of
// 1.5 MiB per call). The block count depends on the shapes only, so the sum order does too.
constexpr int64_t kWgPartialFloats = int64_t{1} << 21;

// Each tile: c (MR × kWgNR, row stride ldc) += Σ_k ap[k]ᵀ gp[k]. Always the whole tile: a
// partial store here (an aligned buffer for the last columns) made GCC keep the accumulators on
// the stack, 2.4× slower (a /tmp harness, 2026-12-01); WgPanel passes a padded buffer instead.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
constexpr int kWgVector = 2;  // AVX-512: 12 × 32 tiles, 24 accumulators of the 32 registers
constexpr int kWgMR = 12;
struct WgRegs {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
};
#else
constexpr int kWgVector = 1;  // AVX2 and FMA: 6 × 16 tiles, 12 accumulators of the 16 registers
constexpr int kWgMR = 6;
struct WgRegs {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
};
#endif
constexpr int kWgNR = 2 * WgRegs::kLanes;  // two registers a row of the tile
template <int MR>
inline void WgTile(const float* ap, const float* gp, int64_t rows, float* c, int64_t ldc) {
  using R = WgRegs;
  constexpr int W = R::kLanes;
  typename R::V lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = R::Zero();
  for (int64_t k = 0; k < rows; ++k) {
    const typename R::V g0 = R::Load(gp + kWgNR * k), g1 = R::Load(gp + kWgNR * k + W);
    const float* ak = ap + MR * k;
    for (int i = 0; i < MR; ++i) {
      const typename R::V ai = R::Broadcast(ak + i);
      lo[i] = R::Fma(ai, g0, lo[i]);
      hi[i] = R::Fma(ai, g1, hi[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    R::Store(ci, R::Add(R::Load(ci), lo[i]));
    R::Store(ci + W, R::Add(R::Load(ci + W), hi[i]));
  }
}
#else
constexpr int kWgVector = 0;  // the portable loop
constexpr int kWgMR = 6, kWgNR = 16;
template <int MR>
inline void WgTile(const float* ap, const float* gp, int64_t rows, float* c, int64_t ldc) {
  for (int64_t k = 0; k < rows; ++k) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < kWgNR; ++j) c[i * ldc + j] += ap[MR * k + i] * gp[kWgNR * k + j];
    }
  }
}
#endif

// bfloat16 operands (mixed-precision products: s5jax.core._products), float32 sums, in a build
// with AVX512_BF16: the same 12 × 32 tiles, each step of the loop two rows at once. A packed
// word holds one element of each of the two rows (the first in its low half), and VDPBF16PS
// adds both products of a pair of words into a float32 lane (rounding to nearest even, with
// denormal inputs read as zero and denormal results flushed: magnitudes below 1.2e-38). Without
// AVX512_BF16 the bfloat16 weight gradient stays with XLA (a transposed copy and its product;
// s5jax.core._products).
#if defined(__AVX512F__) && defined(__AVX512BF16__)
constexpr bool kWgBf16 = true;
template <int MR>
inline void WgTileBf16(const uint32_t* ap, const uint32_t* gp, int64_t steps, float* c,
                       int64_t ldc) {
  __m512 lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < steps; ++k) {
    const __m512bh g0 = (__m512bh)_mm512_loadu_si512(gp + kWgNR * k);
    const __m512bh g1 = (__m512bh)_mm512_loadu_si512(gp + kWgNR * k + 16);
    const uint32_t* ak = ap + MR * k;
    for (int i = 0; i < MR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(ak[i]));
      lo[i] = _mm512_dpbf16_ps(lo[i], ai, g0);
      hi[i] = _mm512_dpbf16_ps(hi[i], ai, g1);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    _mm512_storeu_ps(ci, _mm512_add_ps(_mm512_loadu_ps(ci), lo[i]));
    _mm512_storeu_ps(ci + 16, _mm512_add_ps(_mm512_loadu_ps(ci + 16), hi[i]));
  }
}

// Words of the rows r0 and r1 (r1 null: the zero row past the end), element by element.
inline void InterleaveRows(const uint16_t* r0, const uint16_t* r1, int64_t n, uint32_t* out) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const auto* p0 = reinterpret_cast<const __m256i*>(r0 + k);
    const __m512i x0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p0));
    const __m512i x1 = r1 ? _mm512_cvtepu16_epi32(
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + k)))
                          : _mm512_setzero_si512();
    _mm512_storeu_si512(out + k, _mm512_or_si512(x0, _mm512_slli_epi32(x1, 16)));
  }
  for (; k < n; ++k) out[k] = uint32_t{r0[k]} | (r1 ? uint32_t{r1[k]} << 16 : 0u);
}
#else
constexpr bool kWgBf16 = false;
#endif

// The two element types' packing: In (as stored), Word (a packed panel's unit, 4 bytes), kStep
// rows a step of the tile's loop. Step(src, n, stride, left, buf): the words of the step whose
// first row (n elements, rows `stride` elements apart) starts at src, with `left` rows from there
// to the end of the chunk.
struct WgFloat32 {
  using In = float;
  using Word = float;
  static constexpr int64_t kStep = 1;
  static const Word* Step(const In* src, int64_t, int64_t, int64_t, Word*) { return src; }
  template <int MR>
  static void Tile(const Word* ap, const Word* gp, int64_t steps, float* c, int64_t ldc) {
    WgTile<MR>(ap, gp, steps, c, ldc);
  }
};

#if defined(__AVX512F__) && defined(__AVX512BF16__)
struct WgBfloat16 {
  using In = uint16_t;
  using Word = uint32_t;
  static constexpr int64_t kStep = 2;
  static const Word* Step(const In* src, int64_t n, int64_t stride, int64_t left, Word* buf) {
    InterleaveRows(src, left > 1 ? src + stride : nullptr, n, buf);
    return buf;
  }
  template <int MR>
  static void Tile(const Word* ap, const Word* gp, int64_t steps, float* c, int64_t ldc) {
    WgTileBf16<MR>(ap, gp, steps, c, ldc);
  }
};
#endif

template <typename Kern, int MR>
void WgPanel(const typename Kern::Word* ap, const typename Kern::Word* gpack, int64_t steps,
             float* c, int64_t N) {
  for (int64_t j0 = 0; j0 < N; j0 += kWgNR) {
    const typename Kern::Word* gp = gpack + j0 * steps;
    if (j0 + kWgNR <= N) {
      Kern::template Tile<MR>(ap, gp, steps, c + j0, N);
      continue;
    }
    alignas(64) float t[MR * kWgNR] = {};  // the last columns: a whole tile, then the valid ones
    Kern::template Tile<MR>(ap, gp, steps, t, kWgNR);
    for (int i = 0; i < MR; ++i) {
      for (int64_t j = 0; j < N - j0; ++j) c[i * N + j0 + j] += t[i * kWgNR + j];
    }
  }
}

// The last `rem` (< kWgMR) columns of a: the panel of that width.
template <typename Kern, int MR>
void WgPanelRemainder(int64_t rem, const typename Kern::Word* ap,
                      const typename Kern::Word* gpack, int64_t steps, float* c, int64_t N) {
  if constexpr (MR > 0) {
    if (rem == MR) {
      WgPanel<Kern, MR>(ap, gpack, steps, c, N);
    } else {
      WgPanelRemainder<Kern, MR - 1>(rem, ap, gpack, steps, c, N);
    }
  }
}

// c (K, N) += a[0:R]ᵀ g[0:R], the K columns of a's rows lda elements apart (K ≤ lda: a range of
// a's columns); apack, gpack: kWgRows · (K + kWgMR), kWgRows · (N + kWgNR) words; arow, grow: K
// and N words (a step's words, where Kern packs them).
template <typename Kern>
void WgRows(const typename Kern::In* a, const typename Kern::In* g, int64_t R, int64_t K,
            int64_t lda, int64_t N, float* c, typename Kern::Word* apack,
            typename Kern::Word* gpack, typename Kern::Word* arow, typename Kern::Word* grow) {
  using Word = typename Kern::Word;
  constexpr int64_t S = Kern::kStep;
  const int64_t KM = K / kWgMR, rem = K - kWgMR * KM, NP = (N + kWgNR - 1) / kWgNR;
  for (int64_t r = 0; r < R; r += kWgRows) {
    const int64_t rows = std::min(kWgRows, R - r), steps = (rows + S - 1) / S;
    for (int64_t k = 0; k < steps; ++k) {  // step by step: sequential reads of a and g
      const Word* gk = Kern::Step(g + (r + S * k) * N, N, N, rows - S * k, grow);
      for (int64_t jp = 0; jp < NP; ++jp) {
        Word* dst = gpack + (jp * steps + k) * kWgNR;
        const int64_t cols = std::min<int64_t>(kWgNR, N - kWgNR * jp);
        std::memcpy(dst, gk + kWgNR * jp, static_cast<size_t>(cols) * sizeof(Word));
        for (int64_t j = cols; j < kWgNR; ++j) dst[j] = Word{0};
      }
      const Word* ak = Kern::Step(a + (r + S * k) * lda, K, lda, rows - S * k, arow);
      for (int64_t ip = 0; ip < KM; ++ip) {
        std::memcpy(apack + (ip * steps + k) * kWgMR, ak + kWgMR * ip, kWgMR * sizeof(Word));
      }
      if (rem) std::memcpy(apack + KM * kWgMR * steps + k * rem, ak + kWgMR * KM, rem * sizeof(Word));
    }
    for (int64_t ip = 0; ip < KM; ++ip) {
      WgPanel<Kern, kWgMR>(apack + ip * kWgMR * steps, gpack, steps, c + kWgMR * ip * N, N);
    }
    if (rem) {
      WgPanelRemainder<Kern, kWgMR - 1>(rem, apack + KM * kWgMR * steps, gpack, steps,
                                        c + kWgMR * KM * N, N);
    }
  }
}

// a (B, R, K), g (B, R, N) → c (B, K, N): c[b] = Σ_r a[b, r]ᵀ g[b, r]. A unit of work is one
// block of rows of one batch element and one range of a's columns (c's rows): where the blocks
// are fewer than the threads (a batch of 2 × 1,024 rows was one block, so one thread ran every
// weight gradient of sCIFAR's step while the other waited), the columns are split into ranges
// of whole kWgMR panels, each range packing its own copy of g's chunks. A panel's sums do
// not depend on the range it is in, so every split gives the same bits (tests/test_scan_native.py).
template <typename Kern>
void WeightGradient(const typename Kern::In* a, const typename Kern::In* g, float* c, int64_t B,
                    int64_t R, int64_t K, int64_t N) {
  const int64_t KN = K * N;
  const int64_t most = std::max<int64_t>(2, kWgPartialFloats / std::max<int64_t>(1, KN));
  const int64_t blocks = std::clamp<int64_t>((R + kWgBlock - 1) / kWgBlock, 1, most);
  const int64_t block_rows = (R + blocks - 1) / blocks;
  const int64_t elements = B * R * KN / 16;
  const int64_t panels = (K + kWgMR - 1) / kWgMR;
  const int64_t want = Threads(std::numeric_limits<int64_t>::max(), elements);
  const int64_t parts = std::clamp<int64_t>((want + B * blocks - 1) / (B * blocks), 1, panels);
  const int64_t part_panels = (panels + parts - 1) / parts;
  const int64_t units = B * blocks * parts;
  std::vector<float> partial(static_cast<size_t>(B * blocks * KN), 0.0f);
  ParallelOver(units, elements, [&](int64_t u0, int64_t u1) {
    using Word = typename Kern::Word;
    const int64_t width = std::min(K, part_panels * kWgMR);
    std::vector<Word> apack(static_cast<size_t>(kWgRows * (width + kWgMR)));
    std::vector<Word> gpack(static_cast<size_t>(kWgRows * (N + kWgNR)));
    std::vector<Word> arow(static_cast<size_t>(width)), grow(static_cast<size_t>(N));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bb = u / parts, b = bb / blocks, r0 = std::min(R, (bb % blocks) * block_rows);
      const int64_t rows = std::min(R, r0 + block_rows) - r0;
      const int64_t k0 = std::min(K, (u % parts) * part_panels * kWgMR);
      const int64_t k1 = std::min(K, k0 + part_panels * kWgMR);
      if (k1 <= k0) continue;
      WgRows<Kern>(a + (b * R + r0) * K + k0, g + (b * R + r0) * N, rows, k1 - k0, K, N,
                   partial.data() + bb * KN + k0 * N, apack.data(), gpack.data(), arow.data(),
                   grow.data());
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    float* cb = c + b * KN;
    const float* p = partial.data() + b * blocks * KN;
    std::memcpy(cb, p, static_cast<size_t>(KN) * sizeof(float));
    for (int64_t blk = 1; blk < blocks; ++blk) {
      const float* q = p + blk * KN;
      for (int64_t e = 0; e < KN; ++e) cb[e] += q[e];
    }
  }
}

ffi::Error WeightGradientImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer g,
                              ffi::Result<ffi::AnyBuffer> c) {
  PoolScope scope(&pool);
  auto da = a.dimensions(), dg = g.dimensions();
  if (da.size() < 2 || dg.size() != da.size()) {
    return ffi::Error::InvalidArgument("s5jax_weight_gradient: a (..., R, K), g (..., R, N)");
  }
  const auto type = a.element_type();
  const bool bf16 = kWgBf16 && type == ffi::DataType::BF16;
  if ((type != ffi::DataType::F32 && !bf16) || g.element_type() != type ||
      c->element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument(kWgBf16 ? "s5jax_weight_gradient: float32 or bfloat16 "
                                                 "operands, float32 result"
                                               : "s5jax_weight_gradient: float32 only");
  }
  const size_t nd = da.size();
  const int64_t R = da[nd - 2], K = da[nd - 1], N = dg[nd - 1];
  int64_t B = 1;
  for (size_t d = 0; d + 2 < nd; ++d) {
    if (da[d] != dg[d]) return ffi::Error::InvalidArgument("s5jax_weight_gradient: leading dims differ");
    B *= da[d];
  }
  if (dg[nd - 2] != R || c->element_count() != B * K * N) {
    return ffi::Error::InvalidArgument("s5jax_weight_gradient: shapes do not match");
  }
  if (B * K * N == 0) return ffi::Error::Success();
  float* out = static_cast<float*>(c->untyped_data());
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if (bf16) {
    WeightGradient<WgBfloat16>(static_cast<const uint16_t*>(a.untyped_data()),
                               static_cast<const uint16_t*>(g.untyped_data()), out, B, R, K, N);
    return ffi::Error::Success();
  }
#endif
  WeightGradient<WgFloat32>(static_cast<const float*>(a.untyped_data()),
                            static_cast<const float*>(g.untyped_data()), out, B, R, K, N);
  return ffi::Error::Success();
}

// ---- column dot: d[b, j] = Σ_r (x[b, r, j] − m[b, j]) g[b, r, j] --------------------------------
// The gradient of D in the SSM's feed-through y = … + x ⊙ D (s5jax.core._products.scale_columns),
// m = 0, and BatchNorm's Σ_t ∂y (x − mean) (s5jax.nn._norm), m the mean: x (B, R, N) float32 or
// bfloat16, g (B, R, N) float32 (∂y), m (B, N) float32, d (B, N) float32. XLA's CPU backend
// computes it as a product over the rows with the columns as a batch dimension, and for a
// bfloat16 x first writes a float32 copy of the whole of x (its product takes one dtype): a
// pass that reads 2 and writes 4 bytes an element, then the product reads 8; and it writes x − m
// to memory for its product (kept from the forward pass, where the variance reads it too). Here
// x and g are read once, x widened and shifted in registers. Blocks of kCdBlock rows each sum
// into a partial row of their own (float32, rows in order), and the partials are added in block
// order, so the result does not depend on which thread ran which block.
constexpr int64_t kCdBlock = 1024;

inline float Widen(float v) { return v; }
inline float Widen(uint16_t v) {  // bfloat16 → float32, exact
  const uint32_t u = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename X>
void ColumnDot(const X* x, const float* g, const float* m, float* d, int64_t B, int64_t R,
               int64_t N) {
  const int64_t blocks = std::max<int64_t>(1, (R + kCdBlock - 1) / kCdBlock);
  std::vector<float> partial(static_cast<size_t>(B * blocks * N), 0.0f);
  ParallelOver(B * blocks, B * R * N, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / blocks, r0 = std::min(R, (u % blocks) * kCdBlock);
      const int64_t r1 = std::min(R, r0 + kCdBlock);
      float* __restrict p = partial.data() + u * N;
      const float* __restrict mb = m + b * N;
      for (int64_t r = r0; r < r1; ++r) {
        const X* __restrict xr = x + (b * R + r) * N;
        const float* __restrict gr = g + (b * R + r) * N;
        for (int64_t j = 0; j < N; ++j) p[j] += (Widen(xr[j]) - mb[j]) * gr[j];
      }
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    float* db = d + b * N;
    const float* p = partial.data() + b * blocks * N;
    std::memcpy(db, p, static_cast<size_t>(N) * sizeof(float));
    for (int64_t blk = 1; blk < blocks; ++blk) {
      for (int64_t j = 0; j < N; ++j) db[j] += p[blk * N + j];
    }
  }
}

ffi::Error ColumnDotImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer g,
                         ffi::AnyBuffer m, ffi::Result<ffi::AnyBuffer> d) {
  PoolScope scope(&pool);
  auto dx = x.dimensions(), dg = g.dimensions();
  const size_t nd = dx.size();
  if (nd < 2 || dg.size() != nd) {
    return ffi::Error::InvalidArgument("s5jax_column_dot: x (..., R, N), g (..., R, N)");
  }
  const auto type = x.element_type();
  if ((type != ffi::DataType::F32 && type != ffi::DataType::BF16) ||
      g.element_type() != ffi::DataType::F32 || m.element_type() != ffi::DataType::F32 ||
      d->element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument(
        "s5jax_column_dot: x float32 or bfloat16, g, m and the result float32");
  }
  int64_t B = 1;
  for (size_t k = 0; k < nd; ++k) {
    if (dx[k] != dg[k]) return ffi::Error::InvalidArgument("s5jax_column_dot: shapes differ");
    if (k + 2 < nd) B *= dx[k];
  }
  const int64_t R = dx[nd - 2], N = dx[nd - 1];
  if (d->element_count() != B * N || m.element_count() != B * N) {
    return ffi::Error::InvalidArgument("s5jax_column_dot: m and the result must be (..., N)");
  }
  if (B * N == 0) return ffi::Error::Success();
  float* out = static_cast<float*>(d->untyped_data());
  const float* gp = static_cast<const float*>(g.untyped_data());
  const float* mp = static_cast<const float*>(m.untyped_data());
  if (type == ffi::DataType::BF16) {
    ColumnDot(static_cast<const uint16_t*>(x.untyped_data()), gp, mp, out, B, R, N);
  } else {
    ColumnDot(static_cast<const float*>(x.untyped_data()), gp, mp, out, B, R, N);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxMaterialise, MaterialiseImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxRecurrence, RecurrenceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("per_step")
                                  .Attr<bool>("reverse"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxRecurrenceAdjoint, AdjointImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("per_step")
                                  .Attr<bool>("reverse"));


XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxPlanar, PlanarImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("bidirectional"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxPlanarMixed, PlanarMixedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("bidirectional"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxPlanarAdjoint, PlanarAdjointImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("bidirectional"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxTranspose, TransposeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxWeightGradient, WeightGradientImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(S5jaxColumnDot, ColumnDotImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// The weight gradient's tile in this build (-march=native): 2 AVX-512 registers, 1 AVX2 and FMA,
// 0 the portable loop (correct, not fast: s5jax.core._products never uses it).
extern "C" int S5jaxWeightGradientVector() { return kWgVector; }
// Whether the build has the bfloat16 weight-gradient tile (AVX512_BF16), and whether its host has
// AMX tiles for bfloat16 (where XLA's own products may use them; s5jax.core._products).
extern "C" int S5jaxWeightGradientBfloat16() { return kWgBf16 ? 1 : 0; }
extern "C" int S5jaxBuildHasAmx() {
#if defined(__AMX_BF16__)
  return 1;
#else
  return 0;
#endif
}
