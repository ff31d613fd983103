#include "model/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/json_fields.h"

namespace fern {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxIndexBytes = size_t(64) << 20;

std::string read_small_file(const std::string& path, size_t cap) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  if (size < 0 || static_cast<size_t>(size) > cap) fail("{}: missing or larger than {} bytes", path, cap);
  f.seekg(0);
  std::string s(static_cast<size_t>(size), '\0');
  f.read(s.data(), size);
  return s;
}

bool is_within(const fs::path& child, const fs::path& parent) {
  auto c = child.begin();
  for (auto p = parent.begin(); p != parent.end(); ++p, ++c) {
    if (c == child.end() || *c != *p) return false;
  }
  return true;
}

}  // namespace

std::string resolve_shard_path(const std::string& model_dir, const std::string& shard, const std::string& index_path,
                               const std::string& tensor) {
  auto bad = [&](const std::string& why) {
    fail("{}: tensor \"{}\" maps to shard \"{}\": {}", index_path, tensor, shard, why);
  };
  if (shard.empty()) bad("empty file name");
  if (shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos)
    bad("shard names must be plain file names inside the model directory");
  if (shard == "." || shard == "..") bad("not a file name");
  if (shard.find('\0') != std::string::npos) bad("NUL in file name");
  std::error_code ec;
  const fs::path dir = fs::canonical(model_dir, ec);
  if (ec) fail("{}: cannot resolve the model directory: {}", model_dir, ec.message());
  const fs::path p = dir / shard;
  if (!fs::exists(p, ec)) bad("missing shard file");
  const fs::path real = fs::canonical(p, ec);
  if (ec) bad("cannot resolve: " + ec.message());
  // A symlink inside the directory may still point elsewhere; the resolved path must stay inside.
  if (!is_within(real, dir)) bad("resolves to " + real.string() + ", outside the model directory");
  return real.string();
}

std::shared_ptr<CheckpointFiles> CheckpointFiles::open(const std::string& model_dir) {
  auto ck = std::make_shared<CheckpointFiles>();
  ck->dir_ = model_dir;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) fail("{}: not a directory", model_dir);
  const std::string index_path = (fs::path(model_dir) / "model.safetensors.index.json").string();

  if (fs::exists(index_path, ec)) {
    const nlohmann::json idx = parse_json_bounded(read_small_file(index_path, kMaxIndexBytes), index_path, 16);
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("{}: key weight_map: missing or not an object", index_path);
    std::map<std::string, std::shared_ptr<SafetensorsFile>> by_shard;
    std::map<std::string, std::string> wanted;  // tensor -> shard name
    for (const auto& [tensor, shard] : idx["weight_map"].items()) {
      if (!shard.is_string()) fail("{}: weight_map[\"{}\"] is not a file name", index_path, tensor);
      const std::string s = shard.get<std::string>();
      if (!by_shard.count(s)) {
        by_shard[s] = SafetensorsFile::open(resolve_shard_path(model_dir, s, index_path, tensor));
        ck->files_.push_back(by_shard[s]);
      }
      wanted[tensor] = s;
    }
    for (const auto& [tensor, s] : wanted) {
      const auto& f = by_shard[s];
      const SafetensorsEntry* e = f->find(tensor);
      if (!e) fail("{}: tensor \"{}\" is listed in the index but absent from shard {}", index_path, tensor, s);
      ck->tensors_[tensor] = TensorRef{e, f->data(*e), f->path()};
    }
    for (const auto& f : ck->files_)
      for (const auto& e : f->header().entries)
        if (!wanted.count(e.name)) log::warn("{}: tensor \"{}\" is not in the index; ignored", f->path(), e.name);
    return ck;
  }

  std::vector<std::string> paths;
  const fs::path single = fs::path(model_dir) / "model.safetensors";
  if (fs::exists(single, ec)) {
    paths.push_back(single.string());
  } else {
    for (const auto& de : fs::directory_iterator(model_dir, ec))
      if (de.path().extension() == ".safetensors") paths.push_back(de.path().string());
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) fail("{}: no model.safetensors, model.safetensors.index.json or *.safetensors", model_dir);
  for (const auto& p : paths) {
    auto f = SafetensorsFile::open(p);
    ck->files_.push_back(f);
    for (const auto& e : f->header().entries) {
      auto [it, fresh] = ck->tensors_.emplace(e.name, TensorRef{&e, f->data(e), f->path()});
      if (!fresh) fail("{}: tensor \"{}\" is also in {}", p, e.name, it->second.file);
    }
  }
  return ck;
}

const TensorRef* CheckpointFiles::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> r;
  for (const auto& [n, _] : tensors_) r.push_back(n);
  return r;
}

std::shared_ptr<void> CheckpointFiles::keep_alive() const {
  auto files = std::make_shared<std::vector<std::shared_ptr<SafetensorsFile>>>(files_);
  return std::shared_ptr<void>(files, files.get());
}

uint64_t CheckpointFiles::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

uint8_t* MemoryTensors::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  auto item = std::make_unique<Item>();
  item->entry.name = name;
  item->entry.dtype = dtype;
  item->entry.dtype_name = safetensors_dtype_name(dtype);
  item->entry.shape = shape;
  const uint64_t bytes = static_cast<uint64_t>(item->entry.numel()) * dtype_size(dtype);
  item->entry.begin = 0;
  item->entry.end = bytes;
  item->buf = std::make_shared<HostBuffer>(bytes);
  item->ref = TensorRef{&item->entry, static_cast<const uint8_t*>(item->buf->data()), what_};
  uint8_t* p = static_cast<uint8_t*>(item->buf->data());
  FERN_CHECK(!items_.count(name), "tensor {} added twice", name);
  items_[name] = std::move(item);
  return p;
}

const TensorRef* MemoryTensors::find(const std::string& name) const {
  auto it = items_.find(name);
  return it == items_.end() ? nullptr : &it->second->ref;
}

std::vector<std::string> MemoryTensors::names() const {
  std::vector<std::string> r;
  for (const auto& [n, _] : items_) r.push_back(n);
  return r;
}

std::shared_ptr<void> MemoryTensors::keep_alive() const {
  auto bufs = std::make_shared<std::vector<std::shared_ptr<HostBuffer>>>();
  for (const auto& [_, it] : items_) bufs->push_back(it->buf);
  return std::shared_ptr<void>(bufs, bufs.get());
}

}  // namespace fern
