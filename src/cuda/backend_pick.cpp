// CudaBackend: the next token picked on the device (pick.h). set_pick() writes the request's parameters into device
// memory, so that one recorded step serves every request: the launches read them at each replay.
#include <cmath>
#include <vector>

#include "core/env.h"
#include "cuda/backend_internal.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/cuda_check.h"

namespace fern {
using namespace cuda_backend_detail;

bool CudaBackend::can_pick(const PickParams& p, size_t bias_entries, int64_t vocab) const {
  // Read at every request, so that `fern bench --decode-switch FERN_CUDA_PICK=1,0` compares both in one process.
  const bool on = env_choice("FERN_CUDA_PICK", {"0", "1"}, 1) == 1;
  return on && cuda::pick_supported(vocab) && bias_entries <= size_t(kPickMaxBias) && p.top_k >= 0 &&
         p.top_k <= kPickMaxTopK && p.top_k < vocab;
}

namespace {
// The largest vocabulary the device form serves (pick_supported), for which the buffers are sized: ~2.4 MB in all.
constexpr int64_t kPickBlocksMax = cuda::kPickSortSlots / kPickMaxTopK;
constexpr int64_t kPickVocabMax = kPickBlocksMax * cuda::kPickChunk;
}  // namespace

void CudaBackend::set_pick(const PickParams& p, std::span<const std::pair<int32_t, float>> bias,
                           std::span<const int32_t> prompt, std::span<const int32_t> fed) {
  FERN_CHECK(bias.size() <= size_t(kPickMaxBias), "set_pick: {} logit-bias entries", bias.size());
  join_side();
  if (pick_bufs_.params == nullptr) {
    const int64_t nb = kPickBlocksMax, vmax = kPickVocabMax;
    pick_bufs_.params = static_cast<cuda::PickDevice*>(alloc(DType::U8, {int64_t(sizeof(cuda::PickDevice))}).data);
    pick_bufs_.bias_tok = alloc(DType::I32, {kPickMaxBias}).ptr<int32_t>();
    pick_bufs_.bias_val = alloc(DType::F32, {kPickMaxBias}).ptr<float>();
    pick_bufs_.v = alloc(DType::F32, {vmax}).ptr<float>();
    pick_bufs_.counts = alloc(DType::I32, {vmax}).ptr<int32_t>();
    pick_bufs_.seen = static_cast<uint8_t*>(alloc(DType::U8, {vmax}).data);
    pick_bufs_.cand = static_cast<uint64_t*>(alloc(DType::U64, {nb * kPickMaxTopK}).data);
    pick_bufs_.bsum = static_cast<double*>(alloc(DType::F64, {nb}).data);
    pick_bufs_.flags = alloc(DType::I32, {1}).ptr<int32_t>();
    pick_bufs_.result = static_cast<cuda::PickResult*>(alloc(DType::U8, {int64_t(sizeof(cuda::PickResult))}).data);
    FERN_CUDA_CHECK(cudaMemsetAsync(pick_bufs_.flags, 0, sizeof(int), stream_));
    FERN_CUDA_CHECK(cudaMallocHost(&pick_host_, sizeof(cuda::PickResult)));
    drop_graph();  // a step recorded before this has no pick launches
  }
  std::vector<int32_t> tok(bias.size());
  std::vector<float> val(bias.size());
  for (size_t i = 0; i < bias.size(); ++i) tok[i] = bias[i].first, val[i] = bias[i].second;
  cuda::PickDevice d;
  d.enabled = 1;
  d.top_k = p.top_k;
  d.temperature = p.temperature;
  d.inv_t = p.temperature > 0.0f ? 1.0f / p.temperature : 1.0f;  // as Sampler::sample_at computes them
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : 0.0f;
  d.penalties = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
  d.presence = p.presence_penalty;
  d.frequency = p.frequency_penalty;
  d.repetition = p.repetition_penalty;
  d.n_bias = static_cast<int>(bias.size());
  d.seed = p.seed;
  d.draw = p.draw;
  // Pageable sources: each copy returns once its bytes are staged, so the locals may go.
  if (!bias.empty()) {
    FERN_CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(pick_bufs_.bias_tok), tok.data(), tok.size() * 4,
                                    cudaMemcpyHostToDevice, stream_));
    FERN_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(pick_bufs_.bias_val), val.data(), val.size() * 4,
                                    cudaMemcpyHostToDevice, stream_));
  }
  // The penalties' state as a Sampler that saw the prompt and accepted `fed` (1.25 MB, once per request).
  std::vector<int32_t> counts;
  std::vector<uint8_t> seen;
  if (d.penalties) {
    counts.assign(size_t(kPickVocabMax), 0);
    seen.assign(size_t(kPickVocabMax), 0);
    for (int32_t t : prompt)
      if (t >= 0 && t < kPickVocabMax) seen[size_t(t)] = 1;
    for (int32_t t : fed)
      if (t >= 0 && t < kPickVocabMax) counts[size_t(t)]++, seen[size_t(t)] = 1;
    FERN_CUDA_CHECK(cudaMemcpyAsync(pick_bufs_.counts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice,
                                    stream_));
    FERN_CUDA_CHECK(cudaMemcpyAsync(pick_bufs_.seen, seen.data(), seen.size(), cudaMemcpyHostToDevice, stream_));
  }
  FERN_CUDA_CHECK(cudaMemcpyAsync(pick_bufs_.params, &d, sizeof d, cudaMemcpyHostToDevice, stream_));
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::clear_pick() {
  if (pick_bufs_.params == nullptr) return;
  join_side();
  const cuda::PickDevice off;
  FERN_CUDA_CHECK(cudaMemcpyAsync(pick_bufs_.params, &off, sizeof off, cudaMemcpyHostToDevice, stream_));
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::pick(Tensor ids, Tensor logits) {
  if (pick_bufs_.params == nullptr) return;  // no request has asked for device picks yet
  join_side();
  FERN_CHECK(ids.dtype == DType::I32 && ids.numel() >= 1, "pick: ids {}", ids.shape_str());
  FERN_CHECK(logits.dim(0) == 1, "pick: one row of logits, got {}", logits.shape_str());
  const int64_t V = logits.dim(1);
  FERN_CHECK(cuda::pick_supported(V), "pick: a vocabulary of {} tokens", V);
  cuda::pick(ctx(), f32(logits, "pick logits"), V, pick_bufs_, ids.ptr<int32_t>());
  FERN_CUDA_CHECK(
      cudaMemcpyAsync(pick_host_, pick_bufs_.result, sizeof(cuda::PickResult), cudaMemcpyDeviceToHost, stream_));
}

int32_t CudaBackend::picked() {
  FERN_CHECK(pick_host_ != nullptr, "picked() before set_pick()");
  synchronize();
  return pick_host_->status == 0 ? pick_host_->token : -1;
}

}  // namespace fern
