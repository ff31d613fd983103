// Dot products of 16-byte chunks of weights with activations staged in shared memory: the inner loop of every
// GEMV (linear, MoE gate/up and down). Why it looks like this (PERF.md: a naive nibble-by-nibble kernel was
// instruction-bound at 7% of bandwidth; docs/notes/cuda-decode-v1.md: the v1 loop spent ~290 instructions per
// chunk, mostly on 64-bit index arithmetic and the per-load swizzle):
//  - One 16-byte load per chunk: 32 values (4-bit), 16 (8-bit) or 8 (bf16).
//  - A quantized value q never goes through an int->float conversion: placing it into the mantissa of a float
//    whose exponent is fixed gives OFF + q exactly (OFF = 128 for 4-bit, 256 for 8-bit). The offset is folded into
//    the group's bias: sum_k x_k (s q_k + b) = s * sum_k x_k (OFF + q_k) + (b - OFF s) * sum_k x_k, and
//    sum_k x_k per chunk is precomputed once per activation row (xc).
//  - 4-bit: one AND splits a word into its even nibbles (one per byte) and one shift + AND into its odd nibbles;
//    each byte then becomes a float with a single byte permute (PRMT) that drops it into bits 16..23 under the
//    exponent byte 0x43: 11 integer instructions per 8 values instead of 16 (shift + mask each).
//  - Activations live in shared memory in a lane-major layout (stage_x): the float4 k of chunk c sits at
//    (c / LPR) * (F4 * LPR) + k * LPR + c % LPR, where LPR is the number of lanes that share a row and F4 the
//    float4s per chunk. Lane `sub` of a row walks chunks c = sub + j * LPR, so its reads are one per-lane base
//    plus compile-time offsets, and the 8 lanes of a quarter-warp read 8 consecutive float4s (no bank conflict,
//    no swizzle arithmetic).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace fern::cuda {

template <int BITS>
struct ChunkTraits {
  static constexpr int kElems = 128 / BITS;  // values per 16-byte chunk
  static constexpr int kF4 = kElems / 4;     // float4s of x per chunk
};

// Shared-memory float4 slot of float4 k of chunk c (see the header comment).
template <int BITS, int LPR>
__device__ __forceinline__ int x_slot(int c, int k) {
  constexpr int F4 = ChunkTraits<BITS>::kF4;
  return (c / LPR) * (F4 * LPR) + k * LPR + (c % LPR);
}

// Float4s of shared memory stage_x needs for n inputs (chunks rounded up to a whole LPR-wide column block).
template <int BITS, int LPR>
constexpr int x_slots(int n) {
  constexpr int E = ChunkTraits<BITS>::kElems, F4 = ChunkTraits<BITS>::kF4;
  return (n / E + LPR - 1) / LPR * LPR * F4;
}

// Shared-memory bytes of stage_x for n inputs: the float4 slots and the per-chunk sums (host side, LPR at run time).
template <int BITS>
constexpr size_t x_smem_bytes(int64_t n, int lpr) {
  constexpr int E = ChunkTraits<BITS>::kElems, F4 = ChunkTraits<BITS>::kF4;
  const int64_t chunks = (n / E + lpr - 1) / lpr * lpr;
  return size_t(chunks) * (F4 * 16 + 4);
}

// Per-chunk sum of x for the float4 `v` that this thread holds as float4 f of the row, when the F4 float4s of a
// chunk sit in F4 consecutive lanes (f = base + lane, base a multiple of 32): a shuffle tree instead of a second
// pass over shared memory behind another barrier. Every lane of the warp must call it; the lane holding the
// chunk's first float4 gets the sum.
template <int BITS>
__device__ __forceinline__ float chunk_sum_lanes(const float4& v) {
  constexpr int F4 = ChunkTraits<BITS>::kF4;
  float s = (v.x + v.y) + (v.z + v.w);
#pragma unroll
  for (int o = 1; o < F4; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Where a staged float4 of the input row goes: the lane-major chunk layout above (xs) and the per-chunk sums of x
// (xc). Called by every lane of a warp together (chunk_sum_lanes shuffles), with f = the float4's index in the row,
// consecutive over the lanes of a warp and starting at a multiple of 32; ok: f is inside the row (v is then zero
// outside it). The tensor-core GEMV stages into its own layout through the same interface (gemv_tc.cuh, TcSink).
template <int BITS, int LPR>
struct ChunkSink {
  float4* xs;
  float* xc;
  __device__ __forceinline__ void operator()(int f, bool ok, const float4& v) const {
    constexpr int F4 = ChunkTraits<BITS>::kF4;
    if (ok) xs[x_slot<BITS, LPR>(f / F4, f % F4)] = v;
    if constexpr (BITS != 16) {
      const float s = chunk_sum_lanes<BITS>(v);
      if (ok && f % F4 == 0) xc[f / F4] = s;
    }
  }
};

// Stages n floats of x (n a multiple of 4) through `sink` (ChunkSink: the chunk layout and its sums). Called by the
// whole block (blockDim.x a multiple of 32); ends with __syncthreads(). Each thread first requests all its float4s
// (up to 4 per pass, so that they are in flight together), then hands them over; a sink's shuffles run in the same
// pass, one barrier in all.
// x is always read through L2 (ld.global.cg, an asm volatile load): it was written by the previous kernel (or by
// other blocks of this one), which under PDL still runs while this kernel is resident. A `const __restrict__`
// pointer would let the compiler use the non-coherent path (ld.global.nc), whose contract is data that is read-only
// for the whole life of the kernel, and ptxas may then schedule those loads ahead of griddepcontrol.wait
// (docs/notes/cuda-decode-v6.md).
template <typename Sink>
__device__ __forceinline__ void stage_rows(const float* x, int n, const Sink& sink) {
  constexpr int V = 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int n4 = n / 4, nt = static_cast<int>(blockDim.x);
  for (int base = 0; base < n4; base += V * nt) {  // the same trip count on every thread (shuffles below)
    float4 v[V];
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int f = base + q * nt + static_cast<int>(threadIdx.x);
      v[q] = f < n4 ? __ldcg(x4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int f = base + q * nt + static_cast<int>(threadIdx.x);
      if (base + q * nt < n4) sink(f, f < n4, v[q]);  // the same on every thread: all lanes take part
    }
  }
  __syncthreads();
}

// stage_rows into the chunk layout: xs (lane-major float4s) and xc (per-chunk sums), n a multiple of the chunk width.
template <int BITS, int LPR>
__device__ __forceinline__ void stage_x(const float* x, int n, float4* xs, float* xc) {
  stage_rows(x, n, ChunkSink<BITS, LPR>{xs, xc});
}

// 128 + the byte `i` of w (a value < 16 in bits 16..19 under the exponent of 128.0f).
template <int I>
__device__ __forceinline__ float nib_at(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x43000000u, 0x7044u | (I << 8)));
}
__device__ __forceinline__ float mag8(uint32_t bits) { return __uint_as_float((bits & 0x007F8000u) | 0x43800000u); }

// d[r] = sum_k x_k * (OFF + q_k) over one chunk of N rows (quantized) or sum_k x_k w_k (bf16); the activations
// are read from shared memory once for all N rows. xp: this chunk's float4 0 in the lane-major layout (float4 k
// at xp[k * LPR]), wv[r]: row r's chunk.
template <int BITS, int LPR, int N>
__device__ __forceinline__ void chunk_dot(const uint4 (&wv)[N], const float4* __restrict__ xp, float (&d)[N]) {
  float a[N][2];
#pragma unroll
  for (int r = 0; r < N; ++r) a[r][0] = a[r][1] = 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if constexpr (BITS == 4) {
      // Word m holds values 8m..8m+7, nibble j = value 8m+j.
      const float4 xa = xp[(2 * m) * LPR], xb = xp[(2 * m + 1) * LPR];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        const uint32_t ev = v & 0x0F0F0F0Fu;         // byte i: nibble 2i
        const uint32_t od = (v >> 4) & 0x0F0F0F0Fu;  // byte i: nibble 2i+1
        a[r][0] = fmaf(xa.x, nib_at<0>(ev), a[r][0]);
        a[r][1] = fmaf(xa.y, nib_at<0>(od), a[r][1]);
        a[r][0] = fmaf(xa.z, nib_at<1>(ev), a[r][0]);
        a[r][1] = fmaf(xa.w, nib_at<1>(od), a[r][1]);
        a[r][0] = fmaf(xb.x, nib_at<2>(ev), a[r][0]);
        a[r][1] = fmaf(xb.y, nib_at<2>(od), a[r][1]);
        a[r][0] = fmaf(xb.z, nib_at<3>(ev), a[r][0]);
        a[r][1] = fmaf(xb.w, nib_at<3>(od), a[r][1]);
      }
    } else if constexpr (BITS == 8) {
      const float4 xa = xp[m * LPR];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        a[r][0] = fmaf(xa.x, mag8(v << 15), a[r][0]);
        a[r][1] = fmaf(xa.y, mag8(v << 7), a[r][1]);
        a[r][0] = fmaf(xa.z, mag8(v >> 1), a[r][0]);
        a[r][1] = fmaf(xa.w, mag8(v >> 9), a[r][1]);
      }
    } else {
      // bf16: word m holds values 2m (low half) and 2m+1 (high half); float4 m/2 of the chunk's 2.
      const float4 xa = xp[(m / 2) * LPR];
      const float x0 = (m & 1) ? xa.z : xa.x, x1 = (m & 1) ? xa.w : xa.y;
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        a[r][0] = fmaf(x0, __uint_as_float(v << 16), a[r][0]);
        a[r][1] = fmaf(x1, __uint_as_float(v & 0xffff0000u), a[r][1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) d[r] = a[r][0] + a[r][1];
}

// ---- 4-bit rows against x as three signed 8-bit digits (integer dot products, dp4a) ----
// Why: after the fused MoE's top-k every SM receives its ~60 expert rows at once and then runs their arithmetic
// (docs/notes/cuda-decode-v13-next.md: ~2.3 instructions per weight, latency-bound on 16 warps). Here a word of 8
// codes costs 3 instructions to split (as chunk_dot) and 6 dp4a (4 products each, per digit), instead of 8 PRMT and
// 8 FFMA: 9 instructions per 8 weights instead of 19.
// x is written once per row as x_i = sx (h_i + l_i / 256 + m_i / 65536) with sx = max |x| / 127, h in [-127, 127]
// and l, m in [-128, 127] (the balanced base-256 digits of x / sx rounded to 2^-16): |error| <= sx / 2^17, ~6e-8 of the
// row's largest value (as fine as fp32 relative to the row's maximum). The codes enter as unsigned bytes 0..15 (no
// offset), so the group's affine term is s * dot + b * sum(x) with the exact fp32 chunk sums.
// Layout (LPR = 32 lanes per row, chunk c = lane + 32 u): uint4 slot (c / 32) * 192 + k * 32 + c % 32 holds digit
// p = k / 2, words 2 (k % 2) and 2 (k % 2) + 1 of the chunk as {E_w, O_w, E_w+1, O_w+1}, where E_w packs the digits
// of values 8w, 8w+2, 8w+4, 8w+6 (the even nibbles of code word w, one per byte) and O_w those of 8w+1, 8w+3, ...
constexpr int kQ8Slots = 6;  // uint4 per chunk: 3 digits x 2 halves

// uint4 slots of shared memory for n inputs (n a multiple of 32; chunks rounded up to whole 32-lane columns).
__host__ __device__ constexpr int q8_slots(int n) { return (n / 32 + 31) / 32 * 32 * kQ8Slots; }

// The three digits of a value in units of sx / 65536 (u = x * 65536 / sx, |u| <= 127 * 65536 up to rounding), as
// balanced base-256 digits of the integer V = rint(u): m = V - 256 V1, l = V1 - 256 h with V1 = (V + 128) >> 8 and
// h = (V1 + 128) >> 8, so l and m lie in [-128, 127] and h in [-127, 127] (h = 128 would need |u| >= 127.5 * 65536,
// which the row maximum rules out). The same value as rounding x / sx to 2^-16, in integers: one conversion and two
// add-shifts per value (docs/notes/cuda-decode-v30-int-digits.md). Only the digits' low bytes are packed, so the
// function returns V and V1 for m and l (their low bytes are m's and l's) and h.
__device__ __forceinline__ void q8_digits(float u, int& h, int& vl, int& vm) {
  vm = __float2int_rn(u);
  vl = (vm + 128) >> 8;
  h = (vl + 128) >> 8;
}

// The low bytes of a and b as a 16-bit half (a in byte 0, b in byte 1).
__device__ __forceinline__ uint32_t q8_pair(int a, int b) { return __byte_perm(a, b, 0x0040); }

// Writes the digits of float4 f of the row (values 4f..4f+3, already in units of sx / 65536: Q8Sink::unit) into the
// layout above: per digit two 16-bit halves (the even values into E, the odd ones into O).
__device__ __forceinline__ void q8_put(uint4* xq, int f, float4 u) {
  const int c = f >> 3, i = f & 7, w = i >> 1, sub = i & 1;
  int d[4][3];
  q8_digits(u.x, d[0][0], d[0][1], d[0][2]);
  q8_digits(u.y, d[1][0], d[1][1], d[1][2]);
  q8_digits(u.z, d[2][0], d[2][1], d[2][2]);
  q8_digits(u.w, d[3][0], d[3][1], d[3][2]);
  uint16_t* h16 = reinterpret_cast<uint16_t*>(xq);
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const int slot = (c >> 5) * (kQ8Slots * 32) + (p * 2 + (w >> 1)) * 32 + (c & 31);
    const int word = slot * 4 + 2 * (w & 1);
    h16[word * 2 + sub] = static_cast<uint16_t>(q8_pair(d[0][p], d[2][p]));
    h16[(word + 1) * 2 + sub] = static_cast<uint16_t>(q8_pair(d[1][p], d[3][p]));
  }
}

// Per row r of one chunk: t[r] = 256 A0 + A1 and a2[r] = A2, where Ap = sum_k q_k p_k over the chunk's 32 values
// (|t| < 2^24: exact as a float). xq: this chunk's slot 0 (slot k at xq[k * 32]).
template <int N>
__device__ __forceinline__ void chunk_dot_q8(const uint4 (&wv)[N], const uint4* __restrict__ xq, int (&t)[N],
                                             int (&a2)[N]) {
  int a[N][3];
#pragma unroll
  for (int r = 0; r < N; ++r) a[r][0] = a[r][1] = a[r][2] = 0;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const uint4 p0 = xq[(0 + hf) * 32], p1 = xq[(2 + hf) * 32], p2 = xq[(4 + hf) * 32];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int m = 2 * hf + s;
      const int e0 = int(s ? p0.z : p0.x), o0 = int(s ? p0.w : p0.y);
      const int e1 = int(s ? p1.z : p1.x), o1 = int(s ? p1.w : p1.y);
      const int e2 = int(s ? p2.z : p2.x), o2 = int(s ? p2.w : p2.y);
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        const int ev = int(v & 0x0F0F0F0Fu), od = int((v >> 4) & 0x0F0F0F0Fu);  // bytes 0..15: also signed
        a[r][0] = __dp4a(ev, e0, a[r][0]);
        a[r][1] = __dp4a(ev, e1, a[r][1]);
        a[r][2] = __dp4a(ev, e2, a[r][2]);
        a[r][0] = __dp4a(od, o0, a[r][0]);
        a[r][1] = __dp4a(od, o1, a[r][1]);
        a[r][2] = __dp4a(od, o2, a[r][2]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    t[r] = a[r][0] * 256 + a[r][1];
    a2[r] = a[r][2];
  }
}

// The chunk's dot in units of sx / 65536 (the row's scale applied once per row by the caller's factor).
__device__ __forceinline__ float q8_dot_value(int t, int a2) {
  return fmaf(static_cast<float>(t), 256.0f, static_cast<float>(a2));
}

// acc plus a chunk's contribution from chunk_dot_q8's sums (apply_group's twin for the digit form): s * dot +
// b * xsum, with the dot scaled by the row's factor xsc = sx / 65536 (no offset: the codes entered as 0..15).
__device__ __forceinline__ float q8_apply_group(float acc, int t, int a2, float sc, float bi, float xsum, float xsc) {
  return fmaf(sc * xsc, q8_dot_value(t, a2), fmaf(bi, xsum, acc));
}

// Where a staged float4 of a normed row goes in the digit form (stage_x_norm's sink, 4-bit rows of 32 lanes): the
// digits into xq, the exact fp32 chunk sums into xc. kRowMax: the stager passes it the row's largest magnitude
// (set_row_max, from its block reduction) before the first float4; xsc is then the factor for q8_apply_group. Every
// lane of the warp must call it (chunk_sum_lanes shuffles), with f as for ChunkSink. factor(): the row's factor for
// q8_apply_group (sx / 65536).
struct Q8Sink {
  static constexpr bool kRowMax = true;
  uint4* xq;
  float* xc;
  float rowmax = 0.0f, unit = 0.0f;  // unit: 65536 / sx, what q8_put's values are multiplied by
  __device__ __forceinline__ void set_row_max(float m) {
    rowmax = m;
    // 127 / m first, then the exact power of two: rint(x * unit) = rint((x * 127 / m) * 65536), x / sx rounded to
    // 2^-16 with sx's own rounding.
    unit = m > 0.0f ? (127.0f / m) * 65536.0f : 0.0f;
  }
  __device__ __forceinline__ float factor() const { return rowmax / (127.0f * 65536.0f); }
  __device__ __forceinline__ void operator()(int f, bool ok, const float4& v) const {
    if (ok) q8_put(xq, f, make_float4(v.x * unit, v.y * unit, v.z * unit, v.w * unit));
    const float cs = chunk_sum_lanes<4>(v);
    if (ok && f % ChunkTraits<4>::kF4 == 0) xc[f / ChunkTraits<4>::kF4] = cs;
  }
};

// Where a staged float4 goes in the digit form with a scale per chunk instead of per row (stage_rows' sink, 4-bit
// rows of 32 lanes), for rows with no block reduction of their own (the fused MoE's h): the chunk's largest magnitude
// by shuffles over its 8 lanes (as its sum), its digits in units of that chunk's sx / 65536 into xq (Q8Sink's formulas
// per chunk), the exact fp32 chunk sum into xc and the chunk's factor for q8_apply_group into xf.
struct Q8ChunkSink {
  uint4* xq;
  float* xc;
  float* xf;
  __device__ __forceinline__ void operator()(int f, bool ok, const float4& v) const {
    constexpr int F4 = ChunkTraits<4>::kF4;
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < F4; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // The fast reciprocal (2 ulp) instead of two IEEE divisions per float4: unit and the factor agree to ~1e-7
    // relative, far below the digits' own 2^-17 of the chunk's maximum.
    const float unit = m > 0.0f ? __fdividef(127.0f * 65536.0f, m) : 0.0f;
    if (ok) q8_put(xq, f, make_float4(v.x * unit, v.y * unit, v.z * unit, v.w * unit));
    const float cs = chunk_sum_lanes<4>(v);
    if (ok && f % F4 == 0) {
      xc[f / F4] = cs;
      xf[f / F4] = m * (1.0f / (127.0f * 65536.0f));
    }
  }
};

// m and the largest |x w| of a float4 (the normed row's largest magnitude is that over the row times the norm's
// factor: Q8Sink's row maximum).
__device__ __forceinline__ float max_abs_prod(float m, const float4& x, const float4& w) {
  return fmaxf(fmaxf(fmaxf(m, fabsf(x.x * w.x)), fabsf(x.y * w.y)), fmaxf(fabsf(x.z * w.z), fabsf(x.w * w.w)));
}

// The RMSNorm factor of a row of n values from this thread's sum of squares ss and largest |x w| mx (one block
// reduction for both: block_sum_max), the normed row's largest magnitude handed to the digit sink. BAR > 0: the
// reduction over warps 1.. only, at named barrier BAR (block_sum_max).
template <int BAR = 0>
__device__ __forceinline__ float norm_inv_row_max(float ss, float mx, int n, float eps, float2* red, Q8Sink& sink) {
  const float2 sm = block_sum_max<BAR>(ss, mx, red);
  const float inv = rsqrtf(sm.x / float(n) + eps);
  sink.set_row_max(sm.y * inv);
  return inv;
}

// Whether a sink wants the row's largest magnitude from stage_x_norm (Q8Sink) or not (the fp32 sinks).
template <typename Sink>
constexpr bool sink_wants_row_max() {
  if constexpr (requires { Sink::kRowMax; }) {
    return Sink::kRowMax;
  } else {
    return false;
  }
}

template <int BITS>
constexpr float kOffset = BITS == 4 ? 128.0f : 256.0f;

// A chunk's contribution from its dot: s * dot + (b - OFF s) * xsum (affine), dot (bf16).
template <int BITS>
__device__ __forceinline__ float apply_group(float d, float sc, float bi, float xsum) {
  if constexpr (BITS == 16) {
    return d;
  } else {
    return fmaf(sc, d, (bi - kOffset<BITS> * sc) * xsum);
  }
}

// log2 of the chunks per quantization group (group sizes are powers of two, checked by make_qw), so that a
// chunk's group is a shift of its index.
template <int BITS>
__device__ __forceinline__ int group_shift(const QW& W) {
  if constexpr (BITS == 16) {
    return 0;
  } else {
    return 31 - __clz(W.gs / ChunkTraits<BITS>::kElems);
  }
}

// One matrix (or one expert of a stack) seen as 16-byte chunks: row r's chunk c is w[r * cpr + c]; its group's
// scale and bias are s[r * gpr + (c >> gsh)], b[...]. 32-bit offsets: the largest matrix (lm_head, 248320 rows x
// 64 chunks) has 16M chunks.
// Plain data (no member initialisers) so that a block can keep a table of them in shared memory.
struct ChunkMat {
  const uint4* w;
  const uint16_t* s;
  const uint16_t* b;
  int cpr, gpr, gsh;
};

// Field-by-field select (a conditional reference would put both views on the stack).
__device__ __forceinline__ ChunkMat select(bool c, const ChunkMat& a, const ChunkMat& b) {
  ChunkMat m;
  m.w = c ? a.w : b.w;
  m.s = c ? a.s : b.s;
  m.b = c ? a.b : b.b;
  m.cpr = c ? a.cpr : b.cpr;
  m.gpr = c ? a.gpr : b.gpr;
  m.gsh = c ? a.gsh : b.gsh;
  return m;
}

template <int BITS>
__device__ __forceinline__ ChunkMat chunk_mat(const QW& W, int64_t e) {
  ChunkMat m;
  m.s = m.b = nullptr;
  m.cpr = static_cast<int>(W.in) / ChunkTraits<BITS>::kElems;
  m.gsh = group_shift<BITS>(W);
  m.gpr = m.cpr >> m.gsh;
  if constexpr (BITS == 16) {
    m.w = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(W.w) + e * W.w_expert);
  } else {
    m.w = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(W.w) + e * W.w_expert);
    m.s = W.s + e * W.sb_expert;
    m.b = W.b + e * W.sb_expert;
  }
  return m;
}

// Loads the scale and bias of chunk c's group of row `row` (affine; zero for bf16).
template <int BITS>
__device__ __forceinline__ void load_group(const ChunkMat& m, int row, int c, float& sc, float& bi) {
  if constexpr (BITS != 16) {
    const int g = row * m.gpr + (c >> m.gsh);
    sc = bf16_to_f32(__ldg(m.s + g));
    bi = bf16_to_f32(__ldg(m.b + g));
  } else {
    sc = bi = 0.0f;
  }
}

// The packed scales and biases of a 4-bit row in groups of 64 read by a warp of 32 lanes, 64 chunks at a time
// (docs/notes/cuda-decode-v20-burst.md): the 32 scales and 32 biases of the 64 chunks starting at group g0 (a multiple
// of 32) in one 4-byte load per lane, lanes 0..15 taking the scale words and 16..31 the bias words, instead of two
// 2-byte loads per chunk and lane. The scale and bias arrays must be 4-byte aligned (rows of gpr groups, gpr even).
__device__ __forceinline__ uint32_t load_sb_word(const ChunkMat& m, int row, int g0, int lane) {
  const uint16_t* p = (lane < 16 ? m.s : m.b) + int64_t(row) * m.gpr + g0 + 2 * (lane & 15);
  return __ldg(reinterpret_cast<const uint32_t*>(p));
}
// The scale and bias of chunk lane + 32 u of those 64 (group lane / 2 + 16 u: word lane / 4 + 8 u, half (lane / 2) %
// 2), from the lanes holding them; every lane of the warp must call it (shuffles).
__device__ __forceinline__ void sb_from_word(uint32_t word, int lane, int u, float& sc, float& bi) {
  const int src = (lane >> 2) + 8 * u;
  const bool hi = (lane >> 1) & 1;
  const uint32_t ws = __shfl_sync(0xffffffffu, word, src);
  const uint32_t wb = __shfl_sync(0xffffffffu, word, src + 16);
  sc = __uint_as_float(hi ? ws & 0xffff0000u : ws << 16);
  bi = __uint_as_float(hi ? wb & 0xffff0000u : wb << 16);
}

// N packed 4-bit rows' chunk lane + 32 u (of a step's 64, sb_from_word) against x as 8-bit digits: acc[r] += the
// chunk's group term (q8_apply_group). xq: the chunk's digit slot 0 (this lane's column), xc its fp32 sum, xsc the
// row's factor. The digit form's step of the input projections' GEMV and of the fused MoE's gate/up rows; every
// lane of the warp must call it (shuffles).
template <int N>
__device__ __forceinline__ void q8_rows_chunk(const uint4 (&wv)[N], const uint32_t (&sbw)[N], const uint4* xq,
                                              const float* xc, float xsc, int lane, int u, float (&acc)[N]) {
  int t[N], a2[N];
  chunk_dot_q8<N>(wv, xq, t, a2);
  const float xsum = *xc;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    float sc, bi;
    sb_from_word(sbw[r], lane, u, sc, bi);
    acc[r] = q8_apply_group(acc[r], t[r], a2[r], sc, bi, xsum, xsc);
  }
}

// Loads chunk c of row `row` (weights, and for affine the group's scale and bias).
template <int BITS>
__device__ __forceinline__ void load_chunk(const ChunkMat& m, int row, int c, uint4& wv, float& sc, float& bi) {
  wv = ld_stream(m.w + (row * m.cpr + c));
  load_group<BITS>(m, row, c, sc, bi);
}

}  // namespace fern::cuda
