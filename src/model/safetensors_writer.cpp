#include "model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors.h"

namespace fern {
namespace {

struct PartPlace {
  size_t shard = 0;
  uint64_t offset = 0;  // absolute file offset of the part's first byte
};

struct Shard {
  std::string name;
  std::vector<std::pair<const StreamPart*, uint64_t>> parts;  // part, offset inside the data section
  uint64_t data_bytes = 0;
  uint64_t header_bytes = 0;  // N
  std::string header;
  int fd = -1;
};

void pwrite_all(int fd, const uint8_t* p, uint64_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("{}: write failed: {}", path, std::strerror(errno));
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

}  // namespace

std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<StreamTensor>& tensors,
                                           const ShardWriteOptions& opt) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);

  // Plan: parts in order, a new shard when the next part would pass the limit.
  std::vector<Shard> shards(1);
  std::vector<std::vector<PartPlace>> place(tensors.size());
  uint64_t total = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (const auto& part : tensors[t].parts) {
      const uint64_t b = part.nbytes();
      if (shards.back().data_bytes > 0 && shards.back().data_bytes + b > opt.max_shard_bytes) shards.emplace_back();
      Shard& s = shards.back();
      place[t].push_back({shards.size() - 1, s.data_bytes});
      s.parts.push_back({&part, s.data_bytes});
      s.data_bytes += b;
      total += b;
    }
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    Shard& s = shards[i];
    s.name = shards.size() == 1 ? "model.safetensors"
                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    nlohmann::json h = nlohmann::json::object();
    if (!opt.metadata.empty()) h["__metadata__"] = opt.metadata;
    for (const auto& [part, off] : s.parts)
      h[part->name] = {{"dtype", safetensors_dtype_name(part->dtype)},
                       {"shape", part->shape},
                       {"data_offsets", {off, off + part->nbytes()}}};
    s.header = h.dump();
    // Pad with spaces so the data section starts 8-byte aligned (what the reference writer does).
    while (s.header.size() % 8) s.header.push_back(' ');
    s.header_bytes = s.header.size();
  }
  for (size_t t = 0; t < tensors.size(); ++t)
    for (auto& pl : place[t]) pl.offset += 8 + shards[pl.shard].header_bytes;

  for (auto& s : shards) {
    const std::string tmp = (fs::path(dir) / (s.name + ".tmp")).string();
    s.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s.fd < 0) fail("{}: cannot create: {}", tmp, std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(s.header_bytes >> (8 * i));
    pwrite_all(s.fd, len, 8, 0, tmp);
    pwrite_all(s.fd, reinterpret_cast<const uint8_t*>(s.header.data()), s.header_bytes, 8, tmp);
  }
  auto close_all = [&] {
    for (auto& s : shards)
      if (s.fd >= 0) {
        ::close(s.fd);
        s.fd = -1;
      }
  };

  try {
    uint64_t done = 0;
    std::vector<std::vector<uint8_t>> bufs;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const StreamTensor& st = tensors[t];
      uint64_t row_total = 0;
      for (size_t p = 0; p < st.parts.size(); ++p) row_total += st.row_bytes(p);
      const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(opt.block_bytes / std::max<uint64_t>(1, row_total)));
      bufs.resize(st.parts.size());
      for (int64_t r0 = 0; r0 < st.rows; r0 += block) {
        const int64_t n = std::min(block, st.rows - r0);
        std::vector<uint8_t*> dst(st.parts.size());
        for (size_t p = 0; p < st.parts.size(); ++p) {
          bufs[p].resize(static_cast<size_t>(n) * st.row_bytes(p));
          dst[p] = bufs[p].data();
        }
        st.fill_parallel(r0, n, dst.data());
        for (size_t p = 0; p < st.parts.size(); ++p) {
          const PartPlace& pl = place[t][p];
          pwrite_all(shards[pl.shard].fd, bufs[p].data(), bufs[p].size(),
                     pl.offset + static_cast<uint64_t>(r0) * st.row_bytes(p), shards[pl.shard].name);
          done += bufs[p].size();
        }
        if (opt.progress) opt.progress(done, total);
      }
    }
    for (auto& s : shards)
      if (::close(s.fd) != 0) {
        s.fd = -1;
        fail("{}: close failed: {}", s.name, std::strerror(errno));
      } else {
        s.fd = -1;
      }
  } catch (...) {
    close_all();
    throw;
  }

  std::vector<std::string> names;
  for (auto& s : shards) {
    fs::rename(fs::path(dir) / (s.name + ".tmp"), fs::path(dir) / s.name);
    names.push_back(s.name);
  }
  if (shards.size() == 1) {
    // A stale index from an earlier sharded write into this directory would take precedence when loading.
    std::error_code ec;
    fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
  } else {
    nlohmann::json idx;
    idx["metadata"] = {{"total_size", total}};
    nlohmann::json wm = nlohmann::json::object();
    for (auto& s : shards)
      for (const auto& [part, _] : s.parts) wm[part->name] = s.name;
    idx["weight_map"] = wm;
    std::ofstream f(fs::path(dir) / "model.safetensors.index.json");
    f << idx.dump(4) << "\n";
    if (!f) fail("{}: cannot write model.safetensors.index.json", dir);
    names.push_back("model.safetensors.index.json");
  }
  return names;
}

}  // namespace fern
