// The ceiling of a persistent decode step (docs/notes/cuda-decode-v35-persistent-ceiling.md): what one token's
// weight bytes cost when one resident block per SM streams them through a shared-memory ring while grid-wide
// barriers separate the step's dependent phases, against the same phases as one launch each (today's form).
// Only the memory side of the step is modelled: every phase reads its weights once (the real byte counts of
// Qwen3.6-35B-A3B, MLX 4-bit, step_phases below), every block reads the previous phase's small output vector from L2
// after the barrier (the dependent activation read every real phase has), uses its weights (one add per 32-bit
// word, or a dequantising FMA per 4-bit weight: a crude consumer, ALU- and shared-load-bound, not the real
// kernels' arithmetic) and writes its piece of the next vector. The routed experts' bytes may not be requested
// before the barrier that ends the phase before them (the top-k picks them).
// Usage: bench_cuda_persistent [context (4096)] [chunk KB (16)] [lean (0)] [ring KB (192)] [in flight (ring/chunk)]
// lean 1: the barrier's arrival as one red.release.gpu instead of a fence and an atomic; lean 2: that, and no
// dependent vector read; lean 3 (persistent modes): no barrier, each piece of the vector written with its phase in
// one 8-byte store and polled for by its readers. In flight: a block's copies requested and not yet landed, at most
// (the ring may still hold landed chunks ahead; the memory system's queues hold at most that many per SM).
// Modes:
//   launches   one launch per phase (with PDL, or plain stream order): a block requests its weights before
//              griddepcontrol.wait (once it is resident, i.e. once the previous launch's blocks have left), the
//              kernel's end is the barrier;
//   serial     one persistent launch, a phase's weights requested only after the barrier before it;
//   prefetch   one persistent launch, every phase's weights requested as soon as the ring has room (the routed
//              experts' still after their barrier, and nothing behind them in the ring before them);
//   ahead      as prefetch, the routed experts' bytes too (as if the routing were known: the streaming ceiling);
//   barriers   the persistent schedule with no weight bytes: barriers and dependent reads alone;
//   one phase  every byte of the step as one phase of one persistent launch (the ring's streaming rate);
//   barriers + stream  the barriers of `barriers` while each block's producer streams its share of every byte into
//              the ring beside them, consumed by nobody: what the boundaries cost under a concurrent stream (if
//              they are independent of it, this takes the longer of the two, not their sum).
// Every block sums the 32-bit words it consumed; the total is checked against the host's sum of the pool (every
// chunk read once: none twice, none missed). For the persistent modes the table also gives where the consumers wait
// (their thread 0's clocks, per step, mean over blocks / the largest block): for their chunks to land, and at the
// boundaries (lean 3: the polling read of the pieces; otherwise the counter's arrival and wait).
// docs/notes/cuda-decode-v35-persistent-ceiling.md section 6 asks which of the two adds in the waiting modes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

using namespace fern;
using namespace fern::cuda;

namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // warp 0 requests, warps 1.. consume
constexpr int kMaxRing = 192 * 1024;                 // shared-memory ring: slots of `chunk` bytes
constexpr int kMaxSlots = 48;                        // 4 KB chunks
constexpr int kAct = 16;                             // floats of the next vector each block writes

struct Phase {
  int64_t off;    // byte offset in the pool
  int64_t bytes;  // multiple of 16
  int routed;     // 1: not requested before the barrier that ends the previous phase
};

struct Args {
  const char* pool;
  const Phase* phases;
  int p0, p1;         // phases [p0, p1) in this launch
  int prefetch;       // 0: none; 1: independent phases ahead; 2: every phase ahead (no routing dependency)
  int fma;            // 1: dequantising FMA per 4-bit weight; 0: one add per word
  int lean;           // 1: the barrier's arrival as one red.release.gpu; 2: also no dependent vector read;
                      // 3: no barrier, the vector's pieces carry their phase (below)
  unsigned* counter;  // grid barrier arrivals (zeroed before each persistent launch)
  float* act;         // [2][blocks * kAct] floats; lean 3: [2][blocks * kAct] (value, tag) pairs
  unsigned long long* sum;
  float* sink;
  int chunk, slots;  // bytes per bulk copy and ring slot (a multiple of 16); slots x chunk = the ring
  int inflight;      // at most this many of a block's copies requested and not yet landed (<= slots)
  unsigned long long* waits;  // non-null: consumer thread 0's clocks waiting for its chunks [0] and at the
                              // boundaries [1], summed over blocks, and the largest block's [2], [3]
  const Phase* stream;  // mode 8: the producer streams these phases' bytes on its own (each slot reused once its
                        // copy has landed, nothing consumed) while the consumers run `phases` (no bytes): the
                        // boundaries under a concurrent stream
};

[[maybe_unused]] __device__ __forceinline__ int first_chunk(int p, int b, int G) { return (b - (p * 37) % G + G) % G; }
// Bytes of chunk c of a phase (the last one may be short).
[[maybe_unused]] __device__ __forceinline__ uint32_t chunk_len(const Phase& ph, int c, int chunk) {
  const int64_t left = ph.bytes - int64_t(c) * chunk;
  return uint32_t(left < chunk ? left : chunk);
}

__global__ void __launch_bounds__(kThreads, 1) step_kernel(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ alignas(8) uint64_t full[kMaxSlots], empty[kMaxSlots];
  const int chunk = a.chunk, slots = a.slots;
  __shared__ float x[2048 + 64];
  __shared__ volatile int passed;  // phases whose ending barrier this block has passed (the producer polls it)
  const int G = gridDim.x, b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nact = G * kAct;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kConsumerWarps);
    }
    ptx::mbar_init_fence();
    passed = a.p0;
  }
  __syncthreads();
  // Copy k of this block (chunk c of phase ph) into its slot, once the slot is free (the caller's wait) and at most
  // a.inflight copies are in flight: copy k - inflight must have landed (that slot's last use is that copy, since
  // inflight <= slots, so the parity names it whether or not its consumers have released it).
  auto request = [&](int k, const Phase& ph, int c) {
    const int s = k % slots;
    if (k >= a.inflight) ptx::mbar_wait(&full[(k - a.inflight) % slots], ((k - a.inflight) / slots) & 1);
    const uint32_t len = chunk_len(ph, c, chunk);
    ptx::mbar_arrive_expect_tx(&full[s], len);
    ptx::bulk_copy_g2s(ring + s * chunk, a.pool + ph.off + int64_t(c) * chunk, len, &full[s]);
  };
  if (warp == 0 && a.stream) {
    if (lane == 0) {
      pdl_wait();
      int k = 0;
      for (int p = a.p0; p < a.p1; ++p) {
        const Phase ph = a.stream[p];
        const int nch = int((ph.bytes + chunk - 1) / chunk);
        for (int c = first_chunk(p, b, G); c < nch; c += G, ++k) {
          if (k >= slots) ptx::mbar_wait(&full[k % slots], ((k / slots) - 1) & 1);  // the slot's last copy landed
          request(k, ph, c);
        }
      }
      for (int j = max(k - slots, 0); j < k; ++j) ptx::mbar_wait(&full[j % slots], (j / slots) & 1);
    }
    return;
  }
  if (warp == 0) {
    if (lane == 0) {
      bool waited = false;  // griddepcontrol.wait done (launches: the routed bytes only after it)
      int k = 0;
      for (int p = a.p0; p < a.p1; ++p) {
        const Phase ph = a.phases[p];
        const int nch = int((ph.bytes + chunk - 1) / chunk);
        const bool hold = a.prefetch == 0 || (ph.routed && a.prefetch == 1);
        if (hold && p > a.p0) {
          while (passed < p) __nanosleep(32);
        }
        if (hold && !waited) {
          pdl_wait();
          waited = true;
        }
        for (int c = first_chunk(p, b, G); c < nch; c += G, ++k) {
          ptx::mbar_wait(&empty[k % slots], ((k / slots) & 1) ^ 1);  // its consumers have released the slot
          request(k, ph, c);
        }
      }
    }
    return;
  }
  const int tc = threadIdx.x - 32;  // consumer thread 0 .. 255
  unsigned long long words = 0;
  float acc = 0.0f;
  int k = 0;
  long long t_data = 0, t_bound = 0;  // (a.waits) clocks in the chunks' and the boundaries' waits
  pdl_wait();
  for (int p = a.p0; p < a.p1; ++p) {
    const Phase ph = a.phases[p];
    // The previous phase's output, written by every block: through L2 (ld.cg), after the barrier.
    const float* src = a.act + (p & 1) * nact;
    if (a.lean == 3) {
      // The pieces as (value, tag) pairs written by one 8-byte store each: a piece is complete when its tag is the
      // phase that reads it, so the wait for the other blocks and the read of their output are one (polling) read
      // (no counter, no fence). The graph clears the pairs before each launch, so no tag is left from an earlier step.
      const uint2* src2 = reinterpret_cast<const uint2*>(a.act) + (p & 1) * nact;
      // All of a thread's pieces are requested together and the round repeated until every tag is there (one
      // round trip when the writers are done, not one per piece).
      constexpr int kPer = 16;  // pieces per thread: blocks * kAct <= 256 * kPer
      uint2 v[kPer];
      bool ready;
      const long long t0 = clock64();
      do {
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const int i = tc + j * 32 * kConsumerWarps;
          if (i < nact)
            asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];"
                         : "=r"(v[j].x), "=r"(v[j].y)
                         : "l"(src2 + i)
                         : "memory");
        }
        ready = true;
#pragma unroll
        for (int j = 0; j < kPer; ++j)
          if (tc + j * 32 * kConsumerWarps < nact) ready = ready && (p == a.p0 || v[j].y == unsigned(p));
      } while (!ready);
      t_bound += clock64() - t0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = tc + j * 32 * kConsumerWarps;
        if (i < 2048) x[i] = __uint_as_float(v[j].x);
      }
    } else {
      for (int i = tc; i < 2048; i += 32 * kConsumerWarps) x[i] = a.lean == 2 ? float(i) : __ldcg(src + (i % nact));
    }
    ptx::bar_sync(1, 32 * kConsumerWarps);
    if (a.lean == 3 && tc == 0) passed = p;  // the phase's input is complete (the producer's routed hold)
    const int nch = int((ph.bytes + chunk - 1) / chunk);
    for (int c = first_chunk(p, b, G); c < nch; c += G, ++k) {
      const int s = k % slots;
      const long long t0 = clock64();
      ptx::mbar_wait(&full[s], (k / slots) & 1);
      t_data += clock64() - t0;
      const int len = int(chunk_len(ph, c, chunk));
      const uint4* w = reinterpret_cast<const uint4*>(ring + s * chunk);
      for (int i = tc; i < len / 16; i += 32 * kConsumerWarps) {
        const uint4 v = w[i];
        words += uint64_t(v.x) + v.y + v.z + v.w;
        if (a.fma) {
          const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int n = 0; n < 8; ++n) {
              const float f = __uint_as_float(0x4B000000u | ((q[j] >> (4 * n)) & 15u)) - 8388608.0f;
              acc = fmaf(f, x[(i + (j * 8 + n) * 64) & 2047], acc);  // the lanes on distinct banks
            }
        }
      }
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[s]);
    }
    // This block's piece of the next vector, then the grid-wide barrier (persistent modes; a launch's end otherwise).
    const float v = warp_sum(acc + float(words & 0xff));
    if (lane == 0) x[2048 + warp] = v;
    ptx::bar_sync(1, 32 * kConsumerWarps);
    if (tc < kAct) {
      const float out = x[2048 + 1 + (tc % kConsumerWarps)] * 1e-3f;
      if (a.lean == 3) {
        uint2* dst = reinterpret_cast<uint2*>(a.act) + ((p + 1) & 1) * nact + b * kAct + tc;
        asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(dst), "r"(__float_as_uint(out)),
                     "r"(unsigned(p + 1))
                     : "memory");
      } else {
        a.act[((p + 1) & 1) * nact + b * kAct + tc] = out;
      }
    }
    if (p + 1 < a.p1 && a.lean != 3) {
      ptx::bar_sync(1, 32 * kConsumerWarps);
      const long long t0 = clock64();
      if (tc == 0) {
        if (a.lean) {
          asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.counter) : "memory");
        } else {
          __threadfence();
          atomicAdd(a.counter, 1u);
        }
        const unsigned target = unsigned(G) * unsigned(p + 1 - a.p0);
        unsigned seen = 0;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(a.counter) : "memory");
        } while (seen < target);
        passed = p + 1;
      }
      ptx::bar_sync(1, 32 * kConsumerWarps);
      t_bound += clock64() - t0;
    }
  }
  // One atomic per block (one per thread, 33,792 on one address, took ~28 us per launch).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) words += __shfl_xor_sync(0xffffffffu, words, o);
  __shared__ unsigned long long warp_words[kConsumerWarps];
  if (lane == 0) warp_words[warp - 1] = words;
  ptx::bar_sync(1, 32 * kConsumerWarps);
  if (tc == 0) {
    unsigned long long t = 0;
    for (int w = 0; w < kConsumerWarps; ++w) t += warp_words[w];
    atomicAdd(a.sum, t);
    if (a.waits != nullptr) {
      atomicAdd(a.waits + 0, static_cast<unsigned long long>(t_data));
      atomicAdd(a.waits + 1, static_cast<unsigned long long>(t_bound));
      atomicMax(a.waits + 2, static_cast<unsigned long long>(t_data));
      atomicMax(a.waits + 3, static_cast<unsigned long long>(t_bound));
    }
  }
  if (acc == 12345.0f) a.sink[b] = acc;  // keeps the FMAs
  pdl_trigger();
#endif
}

// The step's phases at context ctx (bytes of MLX 4-bit rows: 0.5 byte per weight plus a bf16 scale and bias per 64;
// the router and the shared-expert gate 8-bit; KV bf16, 2 KV heads x 256 x (K, V) per position). Every fourth layer
// is a gated-attention layer, the others Gated DeltaNet.
std::vector<Phase> step_phases(int64_t ctx, int64_t& total) {
  auto q4 = [](int64_t rows, int64_t cols) { return rows * (cols / 2 + cols / 64 * 4); };
  auto q8 = [](int64_t rows, int64_t cols) { return rows * (cols + cols / 64 * 4); };
  const int64_t H = 2048;
  std::vector<Phase> ph;
  total = 0;
  auto add = [&](int64_t bytes, int routed) {
    bytes = (bytes + 15) / 16 * 16;
    ph.push_back({total, bytes, routed});
    total += bytes;
  };
  for (int l = 0; l < 40; ++l) {
    const bool attn = l % 4 == 3;
    if (attn) {
      add(q4(16 * 256 * 2 + 2 * 2 * 256, H), 0);  // q (with gate), k, v projections
      add(ctx * 2 * 2 * 256 * 2, 0);              // the KV cache
      add(q4(H, 16 * 256) + q8(256 + 1, H), 0);   // o_proj and the router folded into it
    } else {
      add(q4(2 * 16 * 128 + 2 * 32 * 128 + 64, H), 0);  // in_proj qkvz, b, a
      add(int64_t(32) * 128 * 128 * 4, 0);              // the delta rule's fp32 state (read; its write not modelled)
      add(q4(H, 32 * 128) + q8(256 + 1, H), 0);         // out_proj and the router folded into it
    }
    add(q4(2 * 512, H), 0);                       // the shared expert's gate/up
    add(q4(8 * 2 * 512, H) + q4(8 * H, 512), 1);  // the routed experts' gate/up and down rows, after the top-k
    add(q4(H, 512), 0);                           // the shared expert's down rows
  }
  add(q4(248320, H), 0);  // lm_head
  return ph;
}

}  // namespace

int main(int argc, char** argv) {
  int dev = 0, sms = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 9) {
    std::printf("bulk copies need sm_90+\n");
    return 0;
  }
  if (sms * kAct > 32 * kConsumerWarps * 16) {
    std::printf("more SMs than the tagged vector's reader takes (%d)\n", sms);
    return 0;
  }
  const int64_t ctx = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int chunk = (argc > 2 ? std::atoi(argv[2]) : 16) * 1024;
  const int lean = argc > 3 ? std::atoi(argv[3]) : 0;
  const int kRing = (argc > 4 ? std::atoi(argv[4]) : 192) * 1024;
  if (kRing < 4096 || kRing > kMaxRing || chunk < 4096 || kRing / chunk < 4 || kRing / chunk > kMaxSlots ||
      kRing % chunk != 0) {
    std::fprintf(stderr, "chunk and ring (KB): 4 to 48 slots of at least 4 KB, the ring at most 192 KB\n");
    return 2;
  }
  const int inflight = argc > 5 ? std::atoi(argv[5]) : kRing / chunk;
  if (inflight < 1 || inflight > kRing / chunk) {
    std::fprintf(stderr, "copies in flight: 1 to the ring's slots\n");
    return 2;
  }
  int64_t total = 0;
  std::vector<Phase> ph = step_phases(ctx, total);
  const int np = int(ph.size());
  char* pool = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&pool, total));
  // A pattern the host can sum: word i = i * 2654435761 (mod 2^32); `expected` is the sum of every word, taken as it
  // is written.
  unsigned long long expected = 0;
  {
    std::vector<uint32_t> h(size_t(64) << 20);
    for (int64_t base = 0; base < total / 4; base += int64_t(h.size())) {
      const int64_t n = std::min<int64_t>(int64_t(h.size()), total / 4 - base);
      for (int64_t i = 0; i < n; ++i) {
        h[size_t(i)] = uint32_t(uint64_t(base + i) * 2654435761u);
        expected += h[size_t(i)];
      }
      FERN_CUDA_CHECK(cudaMemcpy(pool + base * 4, h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    }
  }
  Phase* d_ph = nullptr;
  std::vector<Phase> none = ph;
  for (Phase& p : none) p.bytes = 0;
  Phase* d_none = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&d_ph, sizeof(Phase) * np));
  FERN_CUDA_CHECK(cudaMalloc(&d_none, sizeof(Phase) * np));
  FERN_CUDA_CHECK(cudaMemcpy(d_ph, ph.data(), sizeof(Phase) * np, cudaMemcpyHostToDevice));
  FERN_CUDA_CHECK(cudaMemcpy(d_none, none.data(), sizeof(Phase) * np, cudaMemcpyHostToDevice));
  // All bytes as one phase: the ring's streaming rate with no boundary inside the step.
  const Phase one{0, total, 0};
  Phase* d_one = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&d_one, sizeof(Phase)));
  FERN_CUDA_CHECK(cudaMemcpy(d_one, &one, sizeof(Phase), cudaMemcpyHostToDevice));
  unsigned* counter = nullptr;
  float *act = nullptr, *sink = nullptr;
  unsigned long long *sum = nullptr, *waits = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&waits, 4 * sizeof(unsigned long long)));
  FERN_CUDA_CHECK(cudaMalloc(&counter, 4));
  const size_t act_bytes = sizeof(uint2) * 2 * sms * kAct;
  FERN_CUDA_CHECK(cudaMalloc(&act, act_bytes));
  FERN_CUDA_CHECK(cudaMemset(act, 0xff, act_bytes));
  FERN_CUDA_CHECK(cudaMalloc(&sink, sizeof(float) * sms));
  FERN_CUDA_CHECK(cudaMalloc(&sum, 8));
  const size_t smem = kRing;
  FERN_CUDA_CHECK(cudaFuncSetAttribute(step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaStream_t s;
  FERN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Persistent launches rely on every block being resident at once: the grid is the SM count, with nothing else
  // running.
  auto launch = [&](const Args& args, bool pdl) {
    Ctx c;
    c.stream = s;
    c.pdl = pdl;
    cuda::launch(c, "step_kernel", step_kernel, dim3(sms), dim3(kThreads), smem, args);
  };
  // One step in a mode: 0 launches (PDL), 1 serial, 2 prefetch, 3 barriers, 4 ahead, 5 launches (no PDL), 6 launches
  // with no bytes (PDL), 7 every byte in one persistent phase, 8 the barriers of mode 3 while the producers stream
  // every byte beside them (consumed by nobody).
  // Modes whose consumers read no bytes (their sum is 0).
  auto reads_nothing = [](int mode) { return mode == 3 || mode == 6 || mode == 8; };
  auto step = [&](int mode, int fma, unsigned long long* wait_clocks = nullptr) {
    Args a{pool,
           reads_nothing(mode) ? d_none
           : mode == 7            ? d_one
                                  : d_ph,
           0,
           mode == 7 ? 1 : np,
           mode == 2   ? 1
           : mode == 4 ? 2
                       : 0,
           fma,
           lean,
           counter,
           act,
           sum,
           sink,
           chunk,
           kRing / chunk,
           inflight,
           wait_clocks,
           mode == 8 ? d_ph : nullptr};
    if (mode == 0 || mode == 5 || mode == 6) {
      for (int p = 0; p < np; ++p) {
        a.p0 = p;
        a.p1 = p + 1;
        a.prefetch = 1;  // before griddepcontrol.wait, unless routed
        launch(a, mode == 0);
      }
    } else {
      FERN_CUDA_CHECK(cudaMemsetAsync(counter, 0, 4, s));
      if (lean == 3) FERN_CUDA_CHECK(cudaMemsetAsync(act, 0xff, act_bytes, s));  // no tag left from the last step
      launch(a, false);
    }
  };
  const char* names[9] = {"launches (one per phase, PDL)", "persistent, serial",    "persistent, prefetch",
                          "persistent, barriers only",     "persistent, all ahead", "launches (no PDL)",
                          "launches, no bytes (PDL)",      "persistent, one phase",
                          "persistent, barriers + stream"};
  std::printf(
      "== one decode step's memory side at context %lld: %d phases, %.1f MB, %d SMs, %d-thread blocks, %d x %d KB "
      "ring, at most %d copies in flight per block ==\n",
      (long long)ctx, np, total / 1e6, sms, kThreads, kRing / chunk, chunk / 1024, inflight);
  // Consumer thread 0's waits, per step: for its chunks to land and at the boundaries (mean over blocks / the
  // largest block), in us at the peak clock (cudaDevAttrClockRate), from `steps` uncaptured steps after the timing.
  int khz = 0;
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  std::printf("%-32s %-6s %10s %10s %10s %8s %15s %15s\n", "mode", "work", "us/step", "GB/s", "tok/s", "sum",
              "chunk waits", "boundary waits");
  for (int fma : {0, 1}) {
    for (int mode : {0, 5, 6, 1, 2, 4, 3, 7, 8}) {
      if ((mode == 3 || mode == 5 || mode == 6 || mode == 7 || mode == 8) && fma == 1) continue;
      if (fma == 1 && lean != 0) continue;
      FERN_CUDA_CHECK(cudaMemsetAsync(sum, 0, 8, s));
      step(mode, fma);
      unsigned long long got = 0;
      FERN_CUDA_CHECK(cudaMemcpyAsync(&got, sum, 8, cudaMemcpyDeviceToHost, s));
      FERN_CUDA_CHECK(cudaStreamSynchronize(s));
      const bool ok = got == (reads_nothing(mode) ? 0ull : expected);
      const int steps = 8;
      const double ms = bench::graph_median_ms(
                            s,
                            [&] {
                              for (int i = 0; i < steps; ++i) step(mode, fma);
                            },
                            5) /
                        steps;
      const double bytes = mode == 3 || mode == 6 ? 0.0 : double(total);  // mode 8: the stream's rate
      char chunk_w[32] = "-", bound_w[32] = "-";
      if (mode != 0 && mode != 5 && mode != 6) {
        FERN_CUDA_CHECK(cudaMemsetAsync(waits, 0, 4 * sizeof(unsigned long long), s));
        for (int i = 0; i < steps; ++i) step(mode, fma, waits);
        unsigned long long w[4] = {};
        FERN_CUDA_CHECK(cudaMemcpyAsync(w, waits, sizeof(w), cudaMemcpyDeviceToHost, s));
        FERN_CUDA_CHECK(cudaStreamSynchronize(s));
        const double us = 1e3 / double(khz) / steps;  // clocks -> us per step
        std::snprintf(chunk_w, sizeof(chunk_w), "%.0f / %.0f", w[0] * us / sms, w[2] * us);
        std::snprintf(bound_w, sizeof(bound_w), "%.0f / %.0f", w[1] * us / sms, w[3] * us);
      }
      std::printf("%-32s %-6s %10.1f %10.0f %10.1f %8s %15s %15s\n", names[mode], fma ? "fma" : "add", ms * 1e3,
                  bytes / 1e6 / ms, 1e3 / ms, ok ? "ok" : "WRONG", chunk_w, bound_w);
    }
  }
  FERN_CUDA_CHECK(cudaGetLastError());
  cudaFree(pool);
  cudaFree(d_ph);
  cudaFree(d_none);
  cudaFree(d_one);
  cudaFree(counter);
  cudaFree(act);
  cudaFree(sink);
  cudaFree(sum);
  cudaFree(waits);
  return 0;
}
