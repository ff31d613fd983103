// The inner loop of the 4-bit decode GEMV on the tensor cores (mma.sync m16n8k16, bf16 operands, fp32 sums).
// Why it was written (docs/notes/cuda-decode-v10-tc.md): the CUDA-core loop of qdot.cuh spends ~4.9 thread
// instructions per weight (a byte permute and an FFMA per value, plus indexing), and Nsight Compute showed the
// decode GEMVs issue-bound at low occupancy. Here one warp multiplies a 16-row x 256-wide tile of the weights ("an
// item") with 16 MMAs, ~1.2 instructions per weight. Measured: faster only for lm_head (87.7 against 92.6 us);
// the smaller GEMVs are bound by the launch chain and the first loads' latency, not by their instructions, so
// linear.cu takes this loop for lm_head-sized matrices only.
//
// Fragments (PTX ISA, m16n8k16: lane l, g = l / 4, j = l % 4). A's registers hold rows g and g + 8 at the K slots
// 2j, 2j+1 (a0/a1: registers 0, 1) and 2j+8, 2j+9 (registers 2, 3); B's hold column n = g at the same K slots;
// C's c0, c1 are row g at columns 2j, 2j+1 and c2, c3 row g + 8. The order of K inside an MMA is free as long as A
// and B agree, so:
//  - Lane j of a quad takes the 64 codes of group j of the 256-wide block: chunks 2j and 2j+1 (16 bytes each) of
//    rows g and g + 8, four 16-byte loads. A code q enters A as the exact bf16 number 128 + q: the 16-bit pair
//    (q_a, q_{a+4}) of a 32-bit word is ((w >> 4a) & 0x000F000F) | 0x43004300, one shift + LOP3. One word (8 codes)
//    feeds two MMAs: pairs (n0, n4), (n1, n5) in the first, (n2, n6), (n3, n7) in the second.
//  - B's column 2j holds the bf16 part `hi` of x at lane j's K slots, column 2j + 1 the remainder `lo` = bf16(x -
//    hi), and every other column zero: the lanes with g / 2 == j load 16 bytes of a table staged once per block
//    (TcSink), the others keep zero registers. C's c0 + c1 on lane (g, j) is then row g's sum over group j alone,
//    sum (128 + q) (hi + lo), and c2 + c3 row g + 8's: each lane promotes its own group with that group's scale
//    and bias, s * sum + (b - 128 s) * sum(hi + lo) (the same folded offset as the CUDA-core loop, qdot.cuh), with
//    no data moved between lanes until the row's four groups per block are added by two shuffles.
// Group sizes that are a multiple of 64 keep each lane's 64 codes in one group.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/ptx.cuh"
#include "cuda/qdot.cuh"

namespace fern::cuda {

constexpr int kTcK = 256;  // the K width of one item: 4 groups of 64, one per lane of a quad

// Shared-memory layout of the staged row for n inputs: per 256-wide block kb, 8 word pairs mp (mp = 4 * second
// chunk + word), 4 quads j, hi and lo: 16 bytes each (4 bf16 pairs: the two MMAs' B registers of that word); then
// the group sums of hi + lo, one float per 64 inputs. Blocks past the row are zero.
__host__ __device__ constexpr int tc_blocks(int n) { return (n + kTcK - 1) / kTcK; }
__host__ __device__ constexpr int tc_table_uint4s(int n) { return tc_blocks(n) * 64; }
__host__ __device__ constexpr int tc_smem_bytes(int n) { return tc_table_uint4s(n) * 16 + tc_blocks(n) * 4 * 4; }

// x0 as bf16 bits (round to nearest) and its remainder's.
__device__ __forceinline__ void split_bf16(float x0, uint32_t& hi, uint32_t& lo) {
  hi = __bfloat16_as_ushort(__float2bfloat16_rn(x0));
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x0 - __uint_as_float(hi << 16)));
}

// The staging sink (the interface of qdot.cuh's ChunkSink) that writes the B table and the group sums. The float4
// f holds inputs 4f .. 4f + 3: nibbles 0-3 (f even) or 4-7 (f odd) of word f / 2. The lanes of a pair (f, f ^ 1)
// swap halves by one shuffle of two registers: the even lane stores the word's hi entry, the odd lane its lo entry.
struct TcSink {
  uint4* xb;  // tc_table_uint4s(n)
  float* xg;  // tc_blocks(n) * 4
  __device__ __forceinline__ void operator()(int f, bool ok, const float4& v) const {
    uint32_t h[4], l[4];
    split_bf16(v.x, h[0], l[0]);
    split_bf16(v.y, h[1], l[1]);
    split_bf16(v.z, h[2], l[2]);
    split_bf16(v.w, h[3], l[3]);
    const bool odd = f & 1;
    // The even lane needs the odd lane's hi parts, the odd lane the even lane's lo parts.
    const uint32_t s0 = odd ? (h[0] | h[1] << 16) : (l[0] | l[1] << 16);
    const uint32_t s1 = odd ? (h[2] | h[3] << 16) : (l[2] | l[3] << 16);
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    const uint32_t p[4] = {r0 & 0xffffu, r0 >> 16, r1 & 0xffffu, r1 >> 16};  // the partner's values 0..3
    uint4 e;  // entry .x = (n0, n4), .y = (n1, n5), .z = (n2, n6), .w = (n3, n7), low half first
    if (!odd) {
      e = make_uint4(h[0] | p[0] << 16, h[1] | p[1] << 16, h[2] | p[2] << 16, h[3] | p[3] << 16);
    } else {
      e = make_uint4(p[0] | l[0] << 16, p[1] | l[1] << 16, p[2] | l[2] << 16, p[3] | l[3] << 16);
    }
    const int wd = f >> 1, kb = wd >> 5, c = (wd >> 2) & 7, wi = wd & 3;
    const int mp = (c & 1) * 4 + wi, j = c >> 1;
    if (ok) xb[((kb * 8 + mp) * 4 + j) * 2 + (f & 1)] = e;
    // Group sums of what the MMAs see (hi + lo), so that the folded offset cancels exactly what was added.
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) s += __uint_as_float(h[i] << 16) + __uint_as_float(l[i] << 16);
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (ok && (f & 15) == 0) xg[f >> 4] = s;
  }
};

// Zeroes the table entries and group sums of the last block past the row's n inputs (before the staging's
// barrier; any threads of the block).
__device__ __forceinline__ void tc_zero_tail(uint4* xb, float* xg, int n) {
  const int nb = tc_blocks(n);
  // Words [n / 8, nb * 32) each own two entries; groups [n / 64, nb * 4).
  for (int wd = n / 8 + static_cast<int>(threadIdx.x); wd < nb * 32; wd += static_cast<int>(blockDim.x)) {
    const int kb = wd >> 5, c = (wd >> 2) & 7, wi = wd & 3;
    const int idx = ((kb * 8 + (c & 1) * 4 + wi) * 4 + (c >> 1)) * 2;
    xb[idx] = xb[idx + 1] = make_uint4(0, 0, 0, 0);
  }
  for (int gi = n / 64 + static_cast<int>(threadIdx.x); gi < nb * 4; gi += static_cast<int>(blockDim.x)) xg[gi] = 0.0f;
}

// One lane's share of an item: chunks 2j, 2j + 1 of block kb of rows g (w[0..1]) and g + 8 (w[2..3]), and the
// scale and bias of group j of both rows.
struct TcItem {
  uint4 w[4];
  float s[2], b[2];
};

// The pair (q_a, q_{a+4}) of word w as exact bf16 numbers 128 + q.
template <int A>
__device__ __forceinline__ uint32_t code_pair(uint32_t w) {
  return ((w >> (4 * A)) & 0x000F000Fu) | 0x43004300u;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The item's contribution to rows g (acc[0]) and g + 8 (acc[1]) over lane j's group of block kb. xb: the staged
// table; bq: this lane's B entry offset inside a block's word pair (g / 2 == j: g, else -1: zero registers).
__device__ __forceinline__ void tc_item(const TcItem& it, const uint4* __restrict__ xb, const float* __restrict__ xg,
                                        int kb, int j, int bq, float (&acc)[2]) {
  float c[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
  const uint4* xt = xb + kb * 64;
#pragma unroll
  for (int mp = 0; mp < 8; ++mp) {
    const int second = mp >> 2, wi = mp & 3;
    const uint4 bv = bq >= 0 ? xt[mp * 8 + bq] : make_uint4(0, 0, 0, 0);
    const uint32_t w0 = word_of(it.w[second], wi), w8 = word_of(it.w[2 + second], wi);
    // Four accumulator chains (by chunk and word half) so that consecutive MMAs do not wait on each other.
    const uint32_t a0[4] = {code_pair<0>(w0), code_pair<0>(w8), code_pair<1>(w0), code_pair<1>(w8)};
    ptx::mma16816<false>(c[second * 2], a0, bv.x, bv.y);
    const uint32_t a1[4] = {code_pair<2>(w0), code_pair<2>(w8), code_pair<3>(w0), code_pair<3>(w8)};
    ptx::mma16816<false>(c[second * 2 + 1], a1, bv.z, bv.w);
  }
  const float t0 = (c[0][0] + c[0][1]) + (c[1][0] + c[1][1]) + (c[2][0] + c[2][1]) + (c[3][0] + c[3][1]);
  const float t1 = (c[0][2] + c[0][3]) + (c[1][2] + c[1][3]) + (c[2][2] + c[2][3]) + (c[3][2] + c[3][3]);
  const float xs = xg[kb * 4 + j];
  acc[0] = fmaf(it.s[0], t0, fmaf(it.b[0] - 128.0f * it.s[0], xs, acc[0]));
  acc[1] = fmaf(it.s[1], t1, fmaf(it.b[1] - 128.0f * it.s[1], xs, acc[1]));
}

}  // namespace fern::cuda
