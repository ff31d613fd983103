// Thin wrappers of the Hopper warpgroup MMA (wgmma, sm_90a only): one instruction multiplies a 64 x 16 tile of A by
// a 16 x N tile of B into a 64 x N fp32 accumulator spread over the 128 threads of a warpgroup, both operands read
// from shared memory through 64-bit descriptors, asynchronously (the issuing threads go on until they wait).
// Operand layout used here (the only one the descriptors below describe): "K-major, 128-byte swizzle": each row of
// a tile holds 64 bf16 of K (128 bytes), rows in groups of 8 form 1024-byte atoms (the tile 1024-byte aligned), and
// the 16-byte chunk c of row r sits at chunk position c ^ (r % 8), which spreads a column of chunks over all the
// shared-memory banks. A K step of 16 moves the descriptor's start by 32 bytes inside the swizzled row.
// Accumulator layout of m64nNk16 (PTX ISA, wgmma register fragments): warp v of the warpgroup holds rows 16 v ..
// 16 v + 15; lane l holds, for each n8 block j, d[4 j + i] at row 16 v + l / 4 + 8 (i / 2), column 8 j + 2 (l % 4) +
// i % 2 (the mma.sync m16n8 layout, repeated over the N / 8 blocks).
// Compiled for other targets the MMA wrappers trap; callers check gemm_wg_supported() (gemm_wg.h) first.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FERN_HAS_WGMMA 1
#else
#define FERN_HAS_WGMMA 0
#endif

namespace fern::cuda::wgmma {

// Descriptor of a K-major, 128-byte-swizzled operand tile starting at `p` (shared memory, 1024-byte aligned, or
// 32-byte steps into such a tile for the K steps): start address / 16 in bits 0-13, the leading byte offset (unused
// by this layout, 16 bytes by convention) in bits 16-29, the stride between 8-row atoms (1024 bytes) in bits 32-45,
// swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return uint64_t((a & 0x3ffffu) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// The block's dynamic shared memory as a T starting at the next 1024-byte boundary (the swizzle atom: every tile of
// the tile loops' shared-memory structs starts on one; the kernels ask for 1024 bytes of slack).
template <class T>
__device__ __forceinline__ T& smem_at_atom(unsigned char* raw) {
  // An offset added to `raw` rather than an integer rounded and cast back: the pointer keeps its provenance from
  // the kernel's shared array, so reads of the struct's fields compile to ld.shared, not to generic loads (which
  // the profile of the exact-code loop showed on its per-tile sums, after the MMA wait).
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return *reinterpret_cast<T*>(raw + ((1024u - (a & 1023u)) & 1023u));
}

// Byte offset of 16-byte chunk c of row r in a K-major 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4); }

// Orders this warpgroup's earlier register accesses before the next wgmma (required before the first one and
// whenever other instructions touched the accumulators).
__device__ __forceinline__ void fence() {
#if FERN_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if FERN_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() {
#if FERN_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy writes to shared memory (plain stores, cp.async) visible to the async proxy that
// wgmma reads its operands through; then a barrier publishes them to the warpgroups.
__device__ __forceinline__ void fence_proxy_async() {
#if FERN_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator register across the asynchronous MMAs (fp32
// accumulators, and the int32 ones of the 8-bit MMAs).
template <int R>
__device__ __forceinline__ void fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_operand(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The wgmma wrappers, two per width N and operand type (bf16, f16; the accumulator d: N / 2 fp32 registers per
// thread, 64 x N per warpgroup):
//   mma_bf16_nN(d, da, db, acc):    d += A (64 x 16 bf16, shared-memory descriptor da) B^T (N x 16 bf16, descriptor
//     db); acc == 0: d = A B^T (wgmma's scale-d predicate; the old d is not read, which saves zeroing an
//     accumulator before its first MMA); acc defaults to 1;
//   mma_bf16_rs_nN(d, a, db, acc):  the same with A in registers: each warp's 16 rows (warp w of the warpgroup: rows
//     16 w .. 16 w + 15) in the mma.sync m16n8k16 fragment layout: a[0] holds row lane / 4, K 2 (lane % 4) + {0, 1};
//     a[1] row lane / 4 + 8, same K; a[2], a[3] the same rows at K + 8;
//   mma_f16_nN, mma_f16_rs_nN: the same with fp16 operands (the prefill attention on wgmma, attn_prefill_wg.cu; the
//     exact-code GEMM loop on fp16 rows, gemm_tile_q4.cuh).
// One macro writes them from the width's register list (asm operands must be spelled out one by one).
#define FERN_WG_D8(b)                                                                                             \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])
// TY: the operand type (bf16 or f16, both with fp32 accumulation). SD_SS / SD_RS: the asm operand number of `acc` in
// each form (after the accumulator registers and the other inputs).
#if FERN_HAS_WGMMA
#define FERN_WG_TYPED(TY, N, R, DSTR, SS_TAIL, RS_TAIL, SD_SS, SD_RS, ...)                                            \
  __device__ __forceinline__ void mma_##TY##_n##N(float (&d)[R], uint64_t da, uint64_t db, int acc = 1) {          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD_SS ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" DSTR "}, " SS_TAIL ";\n}\n"      \
                 : __VA_ARGS__                                                                                      \
                 : "l"(da), "l"(db), "r"(acc));                                                                     \
  }                                                                                                                 \
  __device__ __forceinline__ void mma_##TY##_rs_n##N(float (&d)[R], const uint32_t (&a)[4], uint64_t db,            \
                                                     int acc = 1) {                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD_RS ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" DSTR "}, " RS_TAIL ";\n}\n"      \
                 : __VA_ARGS__                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));                                 \
  }
#else
#define FERN_WG_TYPED(TY, N, R, DSTR, SS_TAIL, RS_TAIL, SD_SS, SD_RS, ...)                                            \
  __device__ __forceinline__ void mma_##TY##_n##N(float (&d)[R], uint64_t da, uint64_t db, int acc = 1) {          \
    (void)d, (void)da, (void)db, (void)acc;                                                                         \
    __trap();                                                                                                       \
  }                                                                                                                 \
  __device__ __forceinline__ void mma_##TY##_rs_n##N(float (&d)[R], const uint32_t (&a)[4], uint64_t db,            \
                                                     int acc = 1) {                                                 \
    (void)d, (void)a, (void)db, (void)acc;                                                                          \
    __trap();                                                                                                       \
  }
#endif
#define FERN_WG_WRAPPERS(N, R, DSTR, SS_TAIL, RS_TAIL, SD_SS, SD_RS, ...)                                             \
  FERN_WG_TYPED(bf16, N, R, DSTR, SS_TAIL, RS_TAIL, SD_SS, SD_RS, __VA_ARGS__)                                        \
  FERN_WG_TYPED(f16, N, R, DSTR, SS_TAIL, RS_TAIL, SD_SS, SD_RS, __VA_ARGS__)
FERN_WG_WRAPPERS(16, 8,
                 "%0, %1, %2, %3, %4, %5, %6, %7",
                 "%8, %9, p, 1, 1, 0, 0", "{%8, %9, %10, %11}, %12, p, 1, 1, 0",
                 "%10", "%13",
                 FERN_WG_D8(0))
FERN_WG_WRAPPERS(32, 16,
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
                 "%16, %17, p, 1, 1, 0, 0", "{%16, %17, %18, %19}, %20, p, 1, 1, 0",
                 "%18", "%21",
                 FERN_WG_D8(0), FERN_WG_D8(8))
FERN_WG_WRAPPERS(64, 32,
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                 "%32, %33, p, 1, 1, 0, 0", "{%32, %33, %34, %35}, %36, p, 1, 1, 0",
                 "%34", "%37",
                 FERN_WG_D8(0), FERN_WG_D8(8), FERN_WG_D8(16), FERN_WG_D8(24))
FERN_WG_WRAPPERS(96, 48,
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47",
                 "%48, %49, p, 1, 1, 0, 0", "{%48, %49, %50, %51}, %52, p, 1, 1, 0",
                 "%50", "%53",
                 FERN_WG_D8(0), FERN_WG_D8(8), FERN_WG_D8(16), FERN_WG_D8(24),
                 FERN_WG_D8(32), FERN_WG_D8(40))
FERN_WG_WRAPPERS(128, 64,
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63",
                 "%64, %65, p, 1, 1, 0, 0", "{%64, %65, %66, %67}, %68, p, 1, 1, 0",
                 "%66", "%69",
                 FERN_WG_D8(0), FERN_WG_D8(8), FERN_WG_D8(16), FERN_WG_D8(24),
                 FERN_WG_D8(32), FERN_WG_D8(40), FERN_WG_D8(48), FERN_WG_D8(56))
FERN_WG_WRAPPERS(144, 72,
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71",
                 "%72, %73, p, 1, 1, 0, 0", "{%72, %73, %74, %75}, %76, p, 1, 1, 0",
                 "%74", "%77",
                 FERN_WG_D8(0), FERN_WG_D8(8), FERN_WG_D8(16), FERN_WG_D8(24),
                 FERN_WG_D8(32), FERN_WG_D8(40), FERN_WG_D8(48), FERN_WG_D8(56), FERN_WG_D8(64))
#undef FERN_WG_TYPED
#undef FERN_WG_WRAPPERS
#undef FERN_WG_D8

template <int N>
__device__ __forceinline__ void mma_bf16(float (&d)[N / 2], uint64_t da, uint64_t db) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 96 || N == 128 || N == 144, "instantiated widths");
  if constexpr (N == 16)
    mma_bf16_n16(d, da, db);
  else if constexpr (N == 32)
    mma_bf16_n32(d, da, db);
  else if constexpr (N == 64)
    mma_bf16_n64(d, da, db);
  else if constexpr (N == 96)
    mma_bf16_n96(d, da, db);
  else if constexpr (N == 128)
    mma_bf16_n128(d, da, db);
  else
    mma_bf16_n144(d, da, db);
}


// mma_bf16_rs<N> / mma_f16_rs<N>: the register-A forms by token width.
#define FERN_WG_RS_BY_WIDTH(TY)                                                                                    \
  template <int N>                                                                                                 \
  __device__ __forceinline__ void mma_##TY##_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,            \
                                                int acc = 1) {                                                     \
    static_assert(N == 16 || N == 32 || N == 64 || N == 96 || N == 128 || N == 144, "instantiated widths");        \
    if constexpr (N == 16)                                                                                         \
      mma_##TY##_rs_n16(d, a, db, acc);                                                                            \
    else if constexpr (N == 32)                                                                                    \
      mma_##TY##_rs_n32(d, a, db, acc);                                                                            \
    else if constexpr (N == 64)                                                                                    \
      mma_##TY##_rs_n64(d, a, db, acc);                                                                            \
    else if constexpr (N == 96)                                                                                    \
      mma_##TY##_rs_n96(d, a, db, acc);                                                                            \
    else if constexpr (N == 128)                                                                                   \
      mma_##TY##_rs_n128(d, a, db, acc);                                                                           \
    else                                                                                                           \
      mma_##TY##_rs_n144(d, a, db, acc);                                                                           \
  }
FERN_WG_RS_BY_WIDTH(bf16)
FERN_WG_RS_BY_WIDTH(f16)
#undef FERN_WG_RS_BY_WIDTH

}  // namespace fern::cuda::wgmma
