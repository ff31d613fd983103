#include "quant/quantize_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/hf_layout.h"
#include "model/json_fields.h"
#include "model/safetensors_writer.h"
#include "quant/mlx_convert.h"

namespace fern {
namespace fs = std::filesystem;

namespace {

// Where the rows of one logical HF tensor come from: one file tensor, or per-expert tensors.
struct RowSource {
  // rows [r, r+1) of the logical tensor are row `row` of `parts[part]`.
  std::vector<const TensorRef*> parts;
  int64_t rows_per_part = 0;        // rows of each part (per-expert: out of one expert matrix)
  int64_t interleave = 1;           // gate_up from per-expert gate/up: 2 parts per expert
};

void read_row(const TensorRef& t, int64_t row, int64_t cols, float* out) {
  const DType dt = *t.entry->dtype;
  const uint8_t* p = t.data + static_cast<size_t>(row * cols) * dtype_size(dt);
  for (int64_t k = 0; k < cols; ++k) {
    if (dt == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, p + 2 * k, 2);
      out[k] = bf16_to_f32(h);
    } else {
      float f;
      std::memcpy(&f, p + 4 * k, 4);
      out[k] = f;
    }
  }
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("{}: cannot open", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

void quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& opt) {
  const std::string cfg_path = (fs::path(in_dir) / "config.json").string();
  ModelConfig cfg = load_model_config(in_dir);
  if (cfg.quantization) fail("{}: the checkpoint is already quantized (it has a quantization key)", cfg_path);
  if (opt.bits != 4 && opt.bits != 8) fail("--bits must be 4 or 8");
  if (opt.group_size != 32 && opt.group_size != 64 && opt.group_size != 128) fail("--group-size must be 32, 64 or 128");
  auto files = CheckpointFiles::open(in_dir);
  const std::string P = files->find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";

  // Resolve every logical HF tensor to the file tensors it reads from, checking shapes and dtypes first.
  std::vector<HfTensorSpec> specs;
  std::map<std::string, RowSource> sources;
  for (auto spec : hf_tensor_specs(cfg)) {
    std::string file_name = spec.name;
    if (file_name.rfind("model.language_model.", 0) == 0) file_name = P + file_name.substr(21);
    const int64_t cols = spec.cols();
    auto check = [&](const TensorRef& t, const std::vector<int64_t>& shape) {
      if (t.entry->shape != shape)
        fail("{}: tensor \"{}\" has shape [{}], the config implies [{}]", t.file, t.entry->name,
             fmt::join(t.entry->shape, ", "), fmt::join(shape, ", "));
      if (!t.entry->dtype || (*t.entry->dtype != DType::BF16 && *t.entry->dtype != DType::F32))
        fail("{}: tensor \"{}\" has dtype {}, expected BF16 or F32", t.file, t.entry->name, t.entry->dtype_name);
    };
    RowSource src;
    if (spec.role == HfRole::LmHead && !files->find(file_name) && cfg.tie_word_embeddings) continue;
    if (const TensorRef* t = files->find(file_name)) {
      check(*t, spec.shape);
      src.parts = {t};
      src.rows_per_part = spec.rows();
    } else if (spec.role == HfRole::ExpertsGateUp || spec.role == HfRole::ExpertsDown) {
      const std::string base = file_name.substr(0, file_name.find("gate_up_proj") == std::string::npos
                                                       ? file_name.find("down_proj")
                                                       : file_name.find("gate_up_proj"));
      const int64_t E = spec.shape[0];
      const bool gate_up = spec.role == HfRole::ExpertsGateUp;
      src.rows_per_part = gate_up ? spec.shape[1] / 2 : spec.shape[1];
      src.interleave = gate_up ? 2 : 1;
      for (int64_t e = 0; e < E; ++e) {
        for (const char* proj : gate_up ? std::vector<const char*>{"gate_proj", "up_proj"}
                                        : std::vector<const char*>{"down_proj"}) {
          const std::string n = base + std::to_string(e) + "." + proj + ".weight";
          const TensorRef* t = files->find(n);
          if (!t) fail("{}: required tensor \"{}\" (or the fused {}) is missing", in_dir, n, file_name);
          check(*t, {src.rows_per_part, cols});
          src.parts.push_back(t);
        }
      }
    } else {
      fail("{}: required tensor \"{}\" is missing", in_dir, file_name);
    }
    sources[spec.name] = std::move(src);
    specs.push_back(spec);
  }

  HfRowReader read = [&sources](const HfTensorSpec& spec, int64_t row0, int64_t n, float* out) {
    const RowSource& s = sources.at(spec.name);
    const int64_t cols = spec.cols();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = row0 + i;
      // Logical row r of part p: for fused sources p = r / rows_per_part; per-expert gate/up sources hold
      // [gate_e; up_e] for every expert e, i.e. part index = r / rows_per_part as well.
      const int64_t part = r / s.rows_per_part, row = r % s.rows_per_part;
      read_row(*s.parts[static_cast<size_t>(part)], row, cols, out + i * cols);
      // mlx-lm casts every weight to bf16 before quantizing (A_log excepted, which stays fp32).
      if (spec.dtype == DType::BF16)
        for (int64_t k = 0; k < cols; ++k) out[i * cols + k] = round_bf16(out[i * cols + k]);
    }
  };

  const QuantConfig quant = mlx_default_quant(cfg, opt.bits, opt.group_size);
  ModelConfig qcfg = cfg;
  qcfg.quantization = quant;
  ShardWriteOptions wo;
  wo.max_shard_bytes = opt.max_shard_bytes;
  wo.progress = opt.progress;
  fs::create_directories(out_dir);
  write_safetensors(out_dir, mlx_stream_tensors(qcfg, specs, quant, read), wo);

  // config.json: the input's, with the quantization keys mlx-lm adds (under both spellings).
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(read_text(cfg_path));
  nlohmann::ordered_json q;
  q["group_size"] = opt.group_size;
  q["bits"] = opt.bits;
  q["mode"] = "affine";
  for (const auto& [module, p] : quant.overrides) q[module] = {{"group_size", p.group_size}, {"bits", p.bits}};
  j["quantization"] = q;
  j["quantization_config"] = q;
  std::ofstream cf(fs::path(out_dir) / "config.json");
  cf << j.dump(4) << "\n";
  if (!cf) fail("{}/config.json: cannot write", out_dir);

  // Tokenizer, chat template and generation settings travel with the weights.
  for (const auto& de : fs::directory_iterator(in_dir)) {
    const std::string name = de.path().filename().string();
    const std::string ext = de.path().extension().string();
    if (!de.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json") continue;
    if (ext == ".json" || ext == ".jinja" || ext == ".txt" || name == "tokenizer.model")
      fs::copy_file(de.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace fern
