#include "quant/mlx_convert.h"

#include <cstring>

#include "core/bf16.h"
#include "core/error.h"
#include "quant/affine.h"

namespace fern {
namespace {

// Rows of floats held per fill call are bounded by this many elements (4 MB of fp32).
constexpr int64_t kMaxFloatsPerCall = int64_t(1) << 20;

// Maps a row of the output tensor to a row of the HF tensor (identity except for the split gate_up_proj).
using RowMap = std::function<int64_t(int64_t)>;

// Calls read() on runs of consecutive HF rows for output rows [row0, row0+n).
void read_mapped(const HfRowReader& read, const HfTensorSpec& spec, const RowMap& map, int64_t row0, int64_t n,
                 float* out) {
  const int64_t cols = spec.cols();
  int64_t i = 0;
  while (i < n) {
    const int64_t start = map(row0 + i);
    int64_t run = 1;
    while (i + run < n && map(row0 + i + run) == start + run) ++run;
    read(spec, start, run, out + i * cols);
    i += run;
  }
}

void store_row(const float* src, int64_t n, DType dt, uint8_t* dst) {
  if (dt == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else {
    FERN_CHECK(dt == DType::BF16, "store as {}", dtype_name(dt));
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t k = 0; k < n; ++k) d[k] = f32_to_bf16(src[k]);
  }
}

// A dense tensor of `rows` rows of `cols` values, `transform` applied to each fp32 value before storage.
StreamTensor dense_tensor(const HfTensorSpec& spec, std::string name, std::vector<int64_t> shape, DType dt,
                          HfRowReader read, std::function<float(float)> transform) {
  StreamTensor t;
  t.parts.push_back({std::move(name), dt, std::move(shape)});
  t.rows = spec.rows();
  const int64_t cols = spec.cols();
  t.fill = [spec, read, transform, dt, cols](int64_t row0, int64_t n, uint8_t* const* dst) {
    const int64_t step = std::max<int64_t>(1, kMaxFloatsPerCall / cols);
    std::vector<float> buf(static_cast<size_t>(std::min(n, step) * cols));
    for (int64_t r = 0; r < n; r += step) {
      const int64_t cnt = std::min(step, n - r);
      read(spec, row0 + r, cnt, buf.data());
      if (transform)
        for (int64_t k = 0; k < cnt * cols; ++k) buf[k] = transform(buf[k]);
      store_row(buf.data(), cnt * cols, dt, dst[0] + r * cols * static_cast<int64_t>(dtype_size(dt)));
    }
  };
  return t;
}

// A quantized triplet for output rows mapped onto HF rows. `lead` is the output shape without the last dim.
StreamTensor quantized_tensor(const HfTensorSpec& spec, const std::string& module, std::vector<int64_t> lead,
                              const QuantParams& qp, HfRowReader read, RowMap map) {
  const int64_t cols = spec.cols();
  StreamTensor t;
  t.bits = qp.bits;
  t.group_size = qp.group_size;
  auto shape = [&](int64_t last) {
    auto s = lead;
    s.push_back(last);
    return s;
  };
  t.parts.push_back({module + ".weight", DType::U32, shape(cols * qp.bits / 32)});
  t.parts.push_back({module + ".scales", DType::BF16, shape(cols / qp.group_size)});
  t.parts.push_back({module + ".biases", DType::BF16, shape(cols / qp.group_size)});
  t.rows = 1;
  for (auto d : lead) t.rows *= d;
  const int bits = qp.bits, group = qp.group_size;
  t.fill = [spec, read, map, cols, bits, group](int64_t row0, int64_t n, uint8_t* const* dst) {
    const int64_t step = std::max<int64_t>(1, kMaxFloatsPerCall / cols);
    std::vector<float> buf(static_cast<size_t>(std::min(n, step) * cols));
    const int64_t wwords = cols * bits / 32, ngroups = cols / group;
    for (int64_t r = 0; r < n; r += step) {
      const int64_t cnt = std::min(step, n - r);
      read_mapped(read, spec, map, row0 + r, cnt, buf.data());
      for (int64_t i = 0; i < cnt; ++i) {
        const int64_t row = r + i;
        quantize_row(buf.data() + i * cols, cols, bits, group,
                     reinterpret_cast<uint32_t*>(dst[0]) + row * wwords,
                     reinterpret_cast<uint16_t*>(dst[1]) + row * ngroups,
                     reinterpret_cast<uint16_t*>(dst[2]) + row * ngroups);
      }
    }
  };
  return t;
}

RowMap identity_map() {
  return [](int64_t r) { return r; };
}

}  // namespace

QuantConfig mlx_default_quant(const ModelConfig& cfg, int bits, int group_size) {
  QuantConfig q;
  q.defaults = {bits, group_size, true};
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string L = "language_model.model.layers." + std::to_string(i) + ".";
    q.overrides[L + "mlp.gate"] = {8, group_size, true};
    q.overrides[L + "mlp.shared_expert_gate"] = {8, group_size, true};
  }
  return q;
}

std::vector<StreamTensor> mlx_stream_tensors(const ModelConfig& cfg, const std::vector<HfTensorSpec>& specs,
                                             const QuantConfig& quant, HfRowReader read) {
  std::vector<StreamTensor> out;
  for (const auto& spec : specs) {
    const std::string mname = mlx_name_of(spec.name);
    // A linear weight: quantized when its input width is a multiple of the group size (mlx-lm's predicate),
    // otherwise kept in bf16.
    auto linear = [&](const std::string& module, std::vector<int64_t> lead, RowMap map) {
      const QuantParams qp = quant.for_module(module);
      if (qp.enabled && spec.cols() % qp.group_size == 0) {
        out.push_back(quantized_tensor(spec, module, std::move(lead), qp, read, std::move(map)));
      } else {
        FERN_CHECK(lead.size() == spec.shape.size() - 1, "unquantized split tensor {}", module);
        out.push_back(dense_tensor(spec, module + ".weight", spec.shape, DType::BF16, read, nullptr));
      }
    };
    switch (spec.role) {
      case HfRole::Embedding:
      case HfRole::LmHead:
      case HfRole::Linear:
      case HfRole::Router:
      case HfRole::SharedGate: {
        std::vector<int64_t> lead(spec.shape.begin(), spec.shape.end() - 1);
        linear(module_of(mname), lead, identity_map());
        break;
      }
      case HfRole::ExpertsDown: {
        std::vector<int64_t> lead(spec.shape.begin(), spec.shape.end() - 1);
        linear(mname.substr(0, mname.find("mlp.experts.")) + "mlp.switch_mlp.down_proj", lead, identity_map());
        break;
      }
      case HfRole::ExpertsGateUp: {
        const int64_t E = spec.shape[0], I2 = spec.shape[1], I = I2 / 2;
        const std::string base = mname.substr(0, mname.find("mlp.experts.")) + "mlp.switch_mlp.";
        const QuantParams qp = quant.for_module(base + "gate_proj");
        if (!qp.enabled || spec.cols() % qp.group_size != 0)
          fail("{}: experts of input width {} cannot be quantized with group size {}", spec.name, spec.cols(),
               qp.group_size);
        for (int half = 0; half < 2; ++half) {
          RowMap map = [I, I2, half](int64_t r) { return (r / I) * I2 + half * I + r % I; };
          out.push_back(quantized_tensor(spec, base + (half ? "up_proj" : "gate_proj"), {E, I},
                                         quant.for_module(base + (half ? "up_proj" : "gate_proj")), read, map));
        }
        break;
      }
      case HfRole::Norm1p:
        // mlx-lm adds 1 to the bf16 weight in bf16: one rounding of the exact sum.
        out.push_back(dense_tensor(spec, mname, spec.shape, DType::BF16, read, [](float w) { return w + 1.0f; }));
        break;
      case HfRole::GatedNorm:
      case HfRole::DtBias:
        out.push_back(dense_tensor(spec, mname, spec.shape, DType::BF16, read, nullptr));
        break;
      case HfRole::Conv: {
        // [C, 1, K] -> [C, K, 1]: the same bytes in row-major order.
        std::vector<int64_t> shape{spec.shape[0], spec.shape[2], 1};
        out.push_back(dense_tensor(spec, mname, shape, DType::BF16, read, nullptr));
        break;
      }
      case HfRole::ALog:
        out.push_back(dense_tensor(spec, mname, spec.shape, DType::F32, read, nullptr));
        break;
    }
  }
  (void)cfg;
  return out;
}

std::vector<StreamTensor> hf_stream_tensors(const std::vector<HfTensorSpec>& specs, HfRowReader read) {
  std::vector<StreamTensor> out;
  for (const auto& spec : specs) out.push_back(dense_tensor(spec, spec.name, spec.shape, spec.dtype, read, nullptr));
  return out;
}

}  // namespace fern
