// Test helpers for checkpoint files: a small configuration with the real head dims, and a way to read a
// checkpoint's tensors into memory, change them, and write them back (to build bad checkpoints).
#pragma once
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/synth.h"

namespace fern::test {

// The tiny preset with a small vocabulary and hidden size: every tensor kind, a few MB.
inline ModelConfig micro_config() {
  ModelConfig c = synth_preset("tiny");
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.eos_token_ids = {7};
  return c;
}

struct RawTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

inline RawTensors read_all(const std::string& dir) {
  RawTensors r;
  auto ck = CheckpointFiles::open(dir);
  for (const auto& n : ck->names()) {
    const TensorRef* t = ck->find(n);
    RawTensor rt{*t->entry->dtype, t->entry->shape, {}};
    rt.bytes.assign(t->data, t->data + (t->entry->end - t->entry->begin));
    r[n] = std::move(rt);
  }
  return r;
}

// Writes the tensors as a single model.safetensors (removing any index and shards first).
inline void write_all(const std::string& dir, const RawTensors& ts, uint64_t max_shard = uint64_t(1) << 40) {
  namespace fs = std::filesystem;
  for (const auto& de : fs::directory_iterator(dir))
    if (de.path().extension() == ".safetensors" || de.path().filename() == "model.safetensors.index.json")
      fs::remove(de.path());
  std::vector<StreamTensor> st;
  for (const auto& [name, t] : ts) {
    StreamTensor s;
    s.parts = {{name, t.dtype, t.shape}};
    s.rows = 1;
    const RawTensor* src = &t;
    s.fill = [src](int64_t, int64_t, uint8_t* const* dst) {
      if (!src->bytes.empty()) std::memcpy(dst[0], src->bytes.data(), src->bytes.size());
    };
    st.push_back(std::move(s));
  }
  ShardWriteOptions o;
  o.max_shard_bytes = max_shard;
  write_safetensors(dir, st, o);
}

}  // namespace fern::test
