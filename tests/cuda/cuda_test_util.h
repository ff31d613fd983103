// Helpers for the CUDA tests: the CPU backend as the reference, host <-> device copies, raw random affine weights
// (random codes and bf16 scales/biases, negative scales included: faster than quantizing at lm_head size).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_backend.h"
#include "cpu/random_model.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/weight_group.h"
#include "test_util.h"

namespace fern::test {

inline std::unique_ptr<CudaBackend> make_gpu() { return std::make_unique<CudaBackend>(0); }

// A kernel launch context on the backend's stream, with its SM count and PDL setting (for tests that call the
// cuda:: launchers directly).
inline cuda::Ctx gpu_ctx(CudaBackend& gpu) {
  cuda::Ctx c;
  c.stream = gpu.stream();
  c.sms = gpu.sm_count();
  c.pdl = gpu.pdl();
  return c;
}

// Two sets of logits rows [rows, V] (row-major, rows = size / V): NMSE over all values, the fraction of rows with
// the same argmax, and whether every value of `got` is finite; also the rows' own NMSEs (the worst row and the
// median), which tell one outlying row (a near-tied routing choice that flips at one position) from an error
// spread over every row (a kernel that is off everywhere).
struct LogitAgreement {
  double nmse = 0;
  double top1 = 0;
  bool finite = true;
  double worst_row_nmse = 0;
  int64_t worst_row = -1;
  double median_row_nmse = 0;
};
inline LogitAgreement logit_agreement(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  LogitAgreement a;
  a.nmse = nmse(got.data(), ref.data(), got.size());
  const int64_t rows = static_cast<int64_t>(ref.size()) / V;
  int same = 0;
  std::vector<double> row_nmse;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * V;
    const float* f = ref.data() + r * V;
    same += (std::max_element(g, g + V) - g) == (std::max_element(f, f + V) - f);
    row_nmse.push_back(nmse(g, f, size_t(V)));
    if (row_nmse.back() > a.worst_row_nmse) {
      a.worst_row_nmse = row_nmse.back();
      a.worst_row = r;
    }
  }
  if (!row_nmse.empty()) {
    std::nth_element(row_nmse.begin(), row_nmse.begin() + row_nmse.size() / 2, row_nmse.end());
    a.median_row_nmse = row_nmse[row_nmse.size() / 2];
  }
  for (float v : got) a.finite = a.finite && std::isfinite(v);
  a.top1 = rows > 0 ? double(same) / double(rows) : 0.0;
  return a;
}

inline Tensor host_f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  Tensor t(v.data(), DType::F32, shape);
  EXPECT_EQ(size_t(t.numel()), v.size());
  return t;
}

inline std::vector<float> download(CudaBackend& be, const Tensor& t) {
  EXPECT_EQ(t.dtype, DType::F32);
  std::vector<float> v(size_t(t.numel()));
  be.copy(Tensor(v.data(), DType::F32, {t.numel()}), t.reshape({t.numel()}));
  return v;
}

inline Tensor upload_f32(CudaBackend& be, const std::vector<float>& v, const std::vector<int64_t>& shape) {
  Tensor d = be.alloc(DType::F32, shape);
  be.copy(d, Tensor(const_cast<float*>(v.data()), DType::F32, shape));
  return d;
}

// A [T, out] F32 output in persistent device memory filled with NaN, so that an output a kernel fails to write
// makes the NMSE NaN (and the test fail) instead of passing on stale values.
inline Tensor nan_filled(CudaBackend& be, int64_t T, int64_t out) {
  Tensor y = be.alloc(DType::F32, {T, out});
  std::vector<float> poison(size_t(T * out), std::nanf(""));
  be.copy(y, host_f32(poison, {T, out}));
  return y;
}

// Affine weight with uniformly random codes, scales ~ N(0, sd_s) (half of them negative) and biases ~ N(0, sd_b).
inline LinearWeight raw_affine(OwnedStorage& st, const std::string& name, int64_t experts, int64_t out, int64_t in,
                               int bits, int gs, uint64_t seed, float sd_s = 0.02f, float sd_b = 0.05f) {
  LinearWeight w;
  w.name = name;
  w.kind = LinearWeight::Kind::Affine;
  w.experts = experts;
  w.out = out;
  w.in = in;
  w.bits = bits;
  w.group_size = gs;
  auto dims = [&](int64_t last) { return w.shape_of(last); };
  auto make = [&](DType t, const std::vector<int64_t>& d) {
    Tensor probe(nullptr, t, d);
    st.bufs.emplace_back(probe.nbytes());
    probe.data = st.bufs.back().data();
    return probe;
  };
  w.w = make(DType::U32, dims(in * bits / 32));
  w.scales = make(DType::BF16, dims(in / gs));
  w.biases = make(DType::BF16, dims(in / gs));
  std::mt19937_64 rng(seed);
  uint32_t* q = w.w.ptr<uint32_t>();
  for (int64_t i = 0; i < w.w.numel(); ++i) q[i] = static_cast<uint32_t>(rng());
  std::normal_distribution<float> ns(0.0f, sd_s), nb(0.0f, sd_b);
  for (int64_t i = 0; i < w.scales.numel(); ++i) {
    w.scales.ptr<uint16_t>()[i] = f32_to_bf16(ns(rng));
    w.biases.ptr<uint16_t>()[i] = f32_to_bf16(nb(rng));
  }
  return w;
}

inline LinearWeight raw_dense(OwnedStorage& st, const std::string& name, int64_t experts, int64_t out, int64_t in,
                              uint64_t seed, float sd = 0.05f) {
  return make_linear(st, name, randn(size_t(std::max<int64_t>(experts, 1) * out * in), seed, sd), experts, out, in, 16);
}

// One MoE block of random weights (E experts of I, shared expert of Is, width H): experts and shared expert at
// `bits` (16: bf16) with affine group gs, router and shared-expert gate at rbits (their group is gs when rbits ==
// bits, else 64). Scales: 0.01 for the experts, 0.002 for the router and gate, chosen so that the router softmax is
// neither flat nor one-hot (a logit spread of a few units); biases twice the scale. Seeds seed + 1, seed + 2, ...
inline MoeWeights random_moe(OwnedStorage& st, int64_t E, int64_t H, int64_t I, int64_t Is, int bits, int gs,
                             int rbits, uint64_t seed) {
  auto lin = [&](const char* n, int64_t e, int64_t out, int64_t in, int b, float sd) {
    return b == 16 ? raw_dense(st, n, e, out, in, ++seed, sd)
                   : raw_affine(st, n, e, out, in, b, b == bits ? gs : 64, ++seed, sd, sd * 2);
  };
  MoeWeights m;
  m.router = lin("router", 0, E, H, rbits, 0.002f);
  m.gate = lin("gate", E, I, H, bits, 0.01f);
  m.up = lin("up", E, I, H, bits, 0.01f);
  m.down = lin("down", E, H, I, bits, 0.01f);
  m.shared_gate = lin("shared_gate", 0, Is, H, bits, 0.01f);
  m.shared_up = lin("shared_up", 0, Is, H, bits, 0.01f);
  m.shared_down = lin("shared_down", 0, H, Is, bits, 0.01f);
  m.shared_expert_gate = lin("shared_expert_gate", 0, 1, H, rbits, 0.002f);
  return m;
}

// The same block on the GPU.
inline MoeWeights to_device(CudaBackend& be, const MoeWeights& h) {
  return h.map([&](const LinearWeight& w) { return be.to_device(w); });
}

// Moves device matrices into one region (weight_group.h), as upload() and the random device model lay out a layer's
// input projections: dw becomes the views into a region the backend owns, with the same values.
inline void group_on_device(CudaBackend& gpu, std::vector<LinearWeight>& dw) {
  std::vector<const LinearWeight*> p;
  for (const LinearWeight& w : dw) p.push_back(&w);
  const cuda::GroupLayout layout = cuda::group_layout(p);
  ASSERT_FALSE(layout.at.empty());
  Tensor region = gpu.alloc(DType::U8, {int64_t(layout.bytes)});
  std::vector<LinearWeight> g = cuda::group_views(p, layout, region.ptr<char>());
  for (size_t i = 0; i < dw.size(); ++i) {
    const std::pair<const Tensor*, const Tensor*> parts[3] = {
        {&g[i].w, &dw[i].w}, {&g[i].scales, &dw[i].scales}, {&g[i].biases, &dw[i].biases}};
    for (const auto& [to, from] : parts)
      ASSERT_EQ(cudaMemcpy(to->data, from->data, from->nbytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
  }
  dw = g;
}

}  // namespace fern::test
