// upload(): copies host ModelWeights (views into mmaps or host buffers) to one device allocation, through a
// bounded pinned staging buffer (two halves, so that filling one overlaps the copy of the other). The GPU layout
// is the MLX layout byte for byte (docs/CUDA.md); strided expert stacks (the HF fused gate_up) are compacted to
// contiguous stacks; small BF16 vectors become F32; a layer's mixer input projections share one region
// (weight_group.h).
#include <cstring>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/cuda_check.h"
#include "cuda/weight_group.h"

namespace fern {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kStageHalf = size_t(32) << 20;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct DeviceWeights : WeightStorage {
  void* mem = nullptr;
  ~DeviceWeights() override {
    if (mem) cudaFree(mem);
  }
};

// Streams host bytes to device addresses through the pinned staging buffer.
class Stager {
 public:
  Stager(cudaStream_t s, size_t total, std::function<void(size_t, size_t)> progress)
      : stream_(s), total_(total), progress_(std::move(progress)) {
    FERN_CUDA_CHECK(cudaMallocHost(&pinned_, 2 * kStageHalf));
    for (auto& e : ev_) FERN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~Stager() {
    cudaStreamSynchronize(stream_);
    for (auto& e : ev_) cudaEventDestroy(e);
    cudaFreeHost(pinned_);
  }
  void put(void* dst, const void* src, size_t n, bool src_on_device) {
    if (src_on_device) {
      FERN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
      report(n);
      return;
    }
    const char* s = static_cast<const char*>(src);
    char* d = static_cast<char*>(dst);
    while (n > 0) {
      if (fill_ == kStageHalf) flip();
      const size_t k = std::min(n, kStageHalf - fill_);
      char* stage = static_cast<char*>(pinned_) + half_ * kStageHalf + fill_;
      std::memcpy(stage, s, k);
      FERN_CUDA_CHECK(cudaMemcpyAsync(d, stage, k, cudaMemcpyHostToDevice, stream_));
      fill_ += k;
      s += k;
      d += k;
      n -= k;
      report(k);
    }
  }
  void finish() { FERN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  // Switch halves: mark the end of this half's copies, and wait until the other half's copies are done.
  void flip() {
    FERN_CUDA_CHECK(cudaEventRecord(ev_[half_], stream_));
    used_[half_] = true;
    half_ ^= 1;
    if (used_[half_]) FERN_CUDA_CHECK(cudaEventSynchronize(ev_[half_]));
    fill_ = 0;
  }
  void report(size_t k) {
    done_ += k;
    if (progress_) progress_(done_, total_);
  }
  cudaStream_t stream_;
  void* pinned_ = nullptr;
  cudaEvent_t ev_[2]{};
  bool used_[2] = {false, false};
  int half_ = 0;
  size_t fill_ = 0, done_ = 0, total_;
  std::function<void(size_t, size_t)> progress_;
};

// Two passes over the same walk: the first sizes the allocation, the second copies.
class Uploader {
 public:
  explicit Uploader(bool sizing) : sizing_(sizing) {}
  size_t total = 0;
  char* base = nullptr;
  Stager* stager = nullptr;

  Tensor tensor(const Tensor& h, bool to_f32) {
    if (h.empty()) return h;
    const bool convert = to_f32 && h.dtype != DType::F32;
    if (convert)
      FERN_CHECK(h.dtype == DType::BF16, "upload: small vector of dtype {} (expected F32 or BF16)", dtype_name(h.dtype));
    Tensor d = h;
    d.device = Device::Cuda;
    if (convert) d.dtype = DType::F32;
    d.data = reserve(d.nbytes());
    if (!sizing_) {
      if (convert) {
        std::vector<float> tmp(h.numel());
        std::vector<uint16_t> raw(h.numel());
        if (h.device == Device::Cuda)
          FERN_CUDA_CHECK(cudaMemcpy(raw.data(), h.data, h.nbytes(), cudaMemcpyDeviceToHost));
        else
          std::memcpy(raw.data(), h.data, h.nbytes());
        for (size_t i = 0; i < tmp.size(); ++i) tmp[i] = bf16_to_f32(raw[i]);
        stager->put(d.data, tmp.data(), d.nbytes(), false);
      } else {
        stager->put(d.data, h.data, h.nbytes(), h.device == Device::Cuda);
      }
    }
    return d;
  }

  LinearWeight linear(const LinearWeight& h) {
    if (h.empty()) return h;
    LinearWeight d = h;
    const int64_t inner = h.experts > 0 ? h.w.inner() : h.w.numel();
    if (h.experts > 0 && h.expert_stride > 0 && h.expert_stride != inner) {
      // Compact a strided stack: expert e's matrix is `inner` elements at e * expert_stride.
      d.w.device = Device::Cuda;
      d.w.data = reserve(d.w.nbytes());
      if (!sizing_) {
        const size_t es = dtype_size(h.w.dtype);
        for (int64_t e = 0; e < h.experts; ++e)
          stager->put(static_cast<char*>(d.w.data) + size_t(e * inner) * es,
                      static_cast<const char*>(h.w.data) + size_t(e * h.expert_stride) * es, size_t(inner) * es,
                      h.w.device == Device::Cuda);
      }
      d.expert_stride = 0;
    } else {
      d.w = tensor(h.w, false);
    }
    d.scales = tensor(h.scales, false);
    d.biases = tensor(h.biases, false);
    return d;
  }

  // A layer's mixer input projections in one region (weight_group.h: the decode GEMV then reads them as one
  // matrix); matrices that cannot share one are uploaded one by one.
  std::vector<LinearWeight> linear_group(std::span<const LinearWeight* const> hs) {
    const cuda::GroupLayout layout = cuda::group_layout(hs);
    std::vector<LinearWeight> r;
    if (layout.at.empty()) {
      for (const LinearWeight* h : hs) r.push_back(linear(*h));
      return r;
    }
    char* region = static_cast<char*>(reserve(layout.bytes));
    if (sizing_) {
      for (const LinearWeight* h : hs) r.push_back(*h);  // shapes only: the sizing pass keeps no pointers
      return r;
    }
    r = cuda::group_views(hs, layout, region);
    for (size_t i = 0; i < hs.size(); ++i) {
      const LinearWeight& h = *hs[i];
      const Tensor* src[3] = {&h.w, &h.scales, &h.biases};
      const Tensor* dst[3] = {&r[i].w, &r[i].scales, &r[i].biases};
      for (int k = 0; k < 3; ++k)
        stager->put(dst[k]->data, src[k]->data, src[k]->nbytes(), src[k]->device == Device::Cuda);
    }
    return r;
  }

 private:
  void* reserve(size_t n) {
    const size_t off = total;
    total += align_up(n);
    return sizing_ ? nullptr : base + off;
  }
  bool sizing_;
};

void walk(Uploader& u, const ModelWeights& h, ModelWeights& d) {
  d.config = h.config;
  d.embed = u.linear(h.embed);
  d.lm_head = u.linear(h.lm_head);
  d.final_norm = u.tensor(h.final_norm, true);
  d.layers.resize(h.layers.size());
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const LayerWeights& H = h.layers[l];
    LayerWeights& D = d.layers[l];
    D.type = H.type;
    D.input_norm = u.tensor(H.input_norm, true);
    D.post_norm = u.tensor(H.post_norm, true);
    if (H.type == LayerType::LinearAttention) {
      const LinearWeight* in[] = {&H.gdn.in_proj_qkv, &H.gdn.in_proj_z, &H.gdn.in_proj_b, &H.gdn.in_proj_a};
      const std::vector<LinearWeight> g = u.linear_group(in);
      D.gdn.in_proj_qkv = g[0];
      D.gdn.in_proj_z = g[1];
      D.gdn.in_proj_b = g[2];
      D.gdn.in_proj_a = g[3];
      D.gdn.out_proj = u.linear(H.gdn.out_proj);
      D.gdn.conv_w = u.tensor(H.gdn.conv_w, true);
      D.gdn.A_log = u.tensor(H.gdn.A_log, true);
      D.gdn.dt_bias = u.tensor(H.gdn.dt_bias, true);
      D.gdn.norm_w = u.tensor(H.gdn.norm_w, true);
    } else {
      const LinearWeight* in[] = {&H.attn.q_proj, &H.attn.k_proj, &H.attn.v_proj};
      const std::vector<LinearWeight> g = u.linear_group(in);
      D.attn.q_proj = g[0];
      D.attn.k_proj = g[1];
      D.attn.v_proj = g[2];
      D.attn.o_proj = u.linear(H.attn.o_proj);
      D.attn.q_norm = u.tensor(H.attn.q_norm, true);
      D.attn.k_norm = u.tensor(H.attn.k_norm, true);
    }
    D.moe = H.moe.map([&](const LinearWeight& w) { return u.linear(w); });
  }
}

}  // namespace

std::shared_ptr<const ModelWeights> CudaBackend::upload(std::shared_ptr<const ModelWeights> host) {
  join_side();
  FERN_CHECK(host != nullptr, "upload: no weights");
  auto dev = std::make_shared<ModelWeights>();
  Uploader sizing(true);
  {
    ModelWeights scratch;
    walk(sizing, *host, scratch);
  }
  auto storage = std::make_shared<DeviceWeights>();
  const cudaError_t e = cudaMalloc(&storage->mem, std::max<size_t>(sizing.total, 1));
  if (e != cudaSuccess) fail("out of GPU memory uploading {} bytes of weights", sizing.total);
  Uploader copier(false);
  copier.base = static_cast<char*>(storage->mem);
  Stager stager(stream_, sizing.total, upload_progress);
  copier.stager = &stager;
  walk(copier, *host, *dev);
  stager.finish();
  dev->storage.push_back(storage);
  return dev;
}

}  // namespace fern
