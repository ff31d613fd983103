// Causal GQA attention for a chunk of prompt rows on the tensor cores (flash-attention style; MODEL.md 2.3 steps
// 6-7). Plain C++ header (no fmt): shared by attn_prefill.cu, the backend glue, the tests and the benchmark.
// Inputs as for attn_decode (kernels.h): q [T, Hq, D] F32 from attn_prep (normed, roped), qg [T, Hq, 2D] F32 (the
// gate is its second half per head), the BF16 caches [capacity, Hkv, D] already holding rows [0, d_pos[0] + T).
#pragma once
#include <cstdint>

#include "cuda/kernels.h"

namespace fern::cuda {

// Head shapes the kernel handles: head_dim 64, 128 or 256 and 1, 2, 4, 8 or 16 query heads per KV head.
bool attn_prefill_ok(const AttnShape& sh);

// Query rows (token rows x the query heads of one KV head) per block and KV positions per tile, for scratch and
// split sizing.
constexpr int kAttnPrefillRows = 128;
constexpr int kAttnPrefillKeys = 64;

// Pieces the KV length is split into for T rows at host position pos, so that small T over a long cache still
// fills the GPU (sms multiprocessors). 1 when the query tiles alone fill it. Never more than kAttnPrefillMaxSplits,
// and each piece gets at least four KV tiles.
constexpr int kAttnPrefillMaxSplits = 256;
int attn_prefill_splits(const AttnShape& sh, int64_t pos, int T, int sms);

// Row t (absolute position d_pos[0] + t) attends to cache rows [0, d_pos[0] + t]; o [T, Hq*D] =
// softmax(q K^T / sqrt(D)) V * sigmoid(gate). q, the softmax weights and the cache rows are FP16 operands of the
// MMAs (m16n8k16, FP32 accumulation; f16 = false: BF16 q and weights, the previous variant, kept for comparison);
// the softmax itself is FP32. With nsplit > 1 the pieces write unnormalised partial
// results to part_ml [T, Hq, nsplit, 2] and part_acc [T, Hq, nsplit, D] (scratch) and a second kernel merges them;
// with nsplit == 1 both may be null. kv16 (with f16): k_cache / v_cache hold the rows as FP16 (kv_to_f16), not BF16.
void attn_prefill(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                  const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int T,
                  int nsplit, bool f16 = true, bool kv16 = false);

// The rows the attention of a chunk of T rows at position d_pos[0] reads, [0, d_pos[0] + T), of both BF16 caches
// as FP16 into k16 / v16 (rows x Hkv x D each; at most `rows` rows are written), converted exactly as the flash
// kernel converts them in shared memory (finite values past the FP16 range saturate): attn_prefill with kv16 on
// these copies gives the bits of attn_prefill on the caches.
void kv_to_f16(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const uint16_t* k_cache,
               const uint16_t* v_cache, uint16_t* k16, uint16_t* v16, int T, int64_t rows);

// Merges the nsplit partial results of a split attention prefill (part_ml, part_acc as above) and gates them into o.
void attn_prefill_merge(const Ctx& c, const AttnShape& sh, int nsplit, const float* part_ml, const float* part_acc,
                        const float* qg, float* o, int T);

// The same attention on the Hopper warpgroup MMAs (attn_prefill_wg.cu; the backend's choice from 128 rows on, 1.97x
// the flash kernel at 2,048 rows over 129K cached ones on the H200, docs/notes/cuda-prefill-v11-attn-wg.md and
// -v12-attn-pipe.md): fp16 operands
// as the flash kernel, from fp16 copies made once per layer and chunk: the keys as kv_to_f16 writes them (v16 =
// nullptr), the values transposed, vt16 [Hkv, D, ld] (v_to_f16_t; ld = rows rounded up to 64). For sm_90a builds on
// compute capability 9.0, head_dim 128 or 256 (attn_prefill_wg_ok).
bool attn_prefill_wg_ok(const AttnShape& sh);
void v_to_f16_t(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const uint16_t* v_cache, uint16_t* vt16,
                int T, int64_t ld);
void attn_prefill_wg(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                     const uint16_t* k16, const uint16_t* vt16, int64_t ld, float* part_ml, float* part_acc, float* o,
                     int T, int nsplit);

}  // namespace fern::cuda
