// The attention tests' common step: one attn_core call of the same random rows on the CPU and on the GPU.
#pragma once
#include "cuda_test_util.h"

namespace fern::test {

// T random rows of qg, k and v (seeded from seed, seed + 1, seed + 2) through attn_core on both backends, each
// advancing its own state by T; returns the NMSE of the GPU output against the CPU's.
inline double attn_call_nmse(Backend& cpu, CudaBackend& gpu, const AttnWeights& hw, const AttnWeights& dw,
                             const ModelConfig& cfg, SequenceState& cs, SequenceState& gs, int T, uint64_t seed) {
  const int64_t QG = int64_t(2) * cfg.num_attention_heads * cfg.head_dim;
  const int64_t KV = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  const int64_t O = int64_t(cfg.num_attention_heads) * cfg.head_dim;
  auto qg = randn(size_t(T * QG), seed);
  auto k = randn(size_t(T * KV), seed + 1);
  auto v = randn(size_t(T * KV), seed + 2);
  std::vector<float> ref(size_t(T * O));
  cpu.begin_forward();
  cpu.attn_core(host_f32(ref, {T, O}), host_f32(qg, {T, QG}), host_f32(k, {T, KV}), host_f32(v, {T, KV}), hw, cfg,
                cs, 0);
  cpu.advance(cs, T);
  gpu.begin_forward();
  Tensor dy = gpu.scratch(DType::F32, {T, O});
  gpu.attn_core(dy, upload_f32(gpu, qg, {T, QG}), upload_f32(gpu, k, {T, KV}), upload_f32(gpu, v, {T, KV}), dw, cfg,
                gs, 0);
  gpu.advance(gs, T);
  auto got = download(gpu, dy);
  return nmse(got.data(), ref.data(), got.size());
}

}  // namespace fern::test
