// Decode attention with the per-key work on the tensor cores (attn_decode_tc.cu): split-K over the KV length,
// one block per (KV head, split, query row), partials merged and gated by the split kernel's combine (attn.cu).
// Plain header (no fmt): included by .cu files.
#pragma once
#include <cstdint>

#include "cuda/kernels.h"

namespace fern::cuda {

// Which decode attention kernel runs (FERN_CUDA_ATTN_DECODE, read on every call by backend_attn_decode.cpp):
// Tc = attn_decode_tc, Split = the CUDA-core split kernel of attn.cu.
enum class AttnDecodeKernel { Tc, Split };
// The choice for this call from FERN_CUDA_ATTN_DECODE (unset, empty or "auto": the default; "tc"; "split");
// another value throws fern::Error naming the variable. Defined in backend_attn_decode.cpp (host only).
AttnDecodeKernel attn_decode_kernel_choice();

// Shapes the tensor-core kernel takes: head_dim 128 or 256, 1/2/4/8 query heads per KV head.
bool attn_decode_tc_ok(const AttnShape& sh);

// Same contract as attn_decode (kernels.h): T query rows, row t sees positions [0, d_pos[0] + t]; nsplit pieces of
// the KV length (in whole 64-key tiles; pieces past the end write empty partials), then the combine and the gate.
void attn_decode_tc(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                    const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o,
                    int T, int nsplit);

// attn_prep and attn_decode_tc in one attention launch (then the combine) for one query row: the query heads are
// normalised and rotated inside every block, the new K/V row appended by the block whose split holds it.
void attn_decode_tc_prep(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* qg, const float* k,
                         const float* v, const float* q_norm, const float* k_norm, uint16_t* k_cache,
                         uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int nsplit);
// Whether the decode path fuses the prep into the tensor-core kernel: yes unless FERN_CUDA_ATTN_PREP=separate
// (read on every call; comparisons). Another value throws fern::Error naming the variable. Host only.
bool attn_prep_fused();

// The split kernel's combine alone (attn.cu): part_ml holds (max in natural-log units, sum) per split.
void attn_decode_combine(const Ctx& c, const AttnShape& sh, int nsplit, const float* part_ml, const float* part_acc,
                         const float* qg, float* o, int T);

}  // namespace fern::cuda
