#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"
#include "model/json_fields.h"

namespace fern {
namespace {

struct DtypeInfo {
  const char* name;
  int bits;
  std::optional<DType> type;
};

// The dtype list of the reference library (RELIABILITY.md 1.2); those without an engine type still validate.
const DtypeInfo kDtypes[] = {
    {"BOOL", 8, DType::BOOL},       {"F4", 4, std::nullopt},        {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},   {"U8", 8, DType::U8},           {"I8", 8, DType::I8},
    {"F8_E5M2", 8, std::nullopt},   {"F8_E4M3", 8, std::nullopt},   {"F8_E8M0", 8, std::nullopt},
    {"F8_E4M3FNUZ", 8, std::nullopt}, {"F8_E5M2FNUZ", 8, std::nullopt}, {"I16", 16, DType::I16},
    {"U16", 16, DType::U16},        {"F16", 16, DType::F16},        {"BF16", 16, DType::BF16},
    {"I32", 32, DType::I32},        {"U32", 32, DType::U32},        {"F32", 32, DType::F32},
    {"C64", 64, std::nullopt},      {"F64", 64, DType::F64},        {"I64", 64, DType::I64},
    {"U64", 64, DType::U64},
};

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& v, const std::string& source) {
  auto bad = [&](const std::string& why) { fail("{}: tensor \"{}\": {}", source, name, why); };
  if (!v.is_object()) bad("header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad(std::string("missing \"") + key + "\"");
  for (const auto& [k, _] : v.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets") bad("unknown field \"" + k + "\"");

  SafetensorsEntry e;
  e.name = name;
  if (!v["dtype"].is_string()) bad("dtype is not a string");
  e.dtype_name = v["dtype"].get<std::string>();
  const DtypeInfo* info = find_dtype(e.dtype_name);
  if (!info) bad("unknown dtype \"" + e.dtype_name + "\"");
  e.dtype = info->type;

  const auto& shape = v["shape"];
  if (!shape.is_array()) bad("shape is not a list");
  if (shape.size() > static_cast<size_t>(kSafetensorsMaxRank))
    bad(fmt::format("rank {} is more than {}", shape.size(), kSafetensorsMaxRank));
  uint64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      bad("shape holds " + json_brief(d) + ", not a non-negative integer");
    uint64_t x = d.get<uint64_t>();
    if (x > static_cast<uint64_t>(INT64_MAX)) bad("dimension too large");
    if (__builtin_mul_overflow(numel, x, &numel)) bad("shape product overflows 64 bits");
    e.shape.push_back(static_cast<int64_t>(x));
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(info->bits), &bits))
    bad("shape x dtype size overflows 64 bits");
  if (bits % 8 != 0) bad("sub-byte tensor does not end on a byte boundary");
  if (numel > static_cast<uint64_t>(INT64_MAX)) bad("too many elements");

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2) bad("data_offsets is not a list of two offsets");
  for (const auto& o : off)
    if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
      bad("data_offsets holds " + json_brief(o) + ", not a non-negative integer");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.end < e.begin) bad(fmt::format("data_offsets [{}, {}] end before begin", e.begin, e.end));
  if (e.end - e.begin != bits / 8)
    bad(fmt::format("data_offsets span {} bytes but shape {} of {} needs {}", e.end - e.begin, shape.dump(),
                    e.dtype_name, bits / 8));
  return e;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &entries[it->second];
}

int safetensors_dtype_bits(const std::string& name) {
  const DtypeInfo* d = find_dtype(name);
  return d ? d->bits : 0;
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDtypes)
    if (d.type && *d.type == t) return d.name;
  return "?";
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t nbytes, uint64_t file_size,
                                           const std::string& source) {
  if (file_size < 8 || nbytes < 8) fail("{}: header too small ({} bytes; a safetensors file starts with 8)", source,
                                        file_size);
  SafetensorsHeader h;
  h.header_size = read_u64_le(bytes);
  if (h.header_size > kSafetensorsMaxHeader)
    fail("{}: header too large ({} bytes, limit {})", source, h.header_size, kSafetensorsMaxHeader);
  if (8 + h.header_size > file_size)
    fail("{}: invalid header length {} for a file of {} bytes", source, h.header_size, file_size);
  if (nbytes < 8 + h.header_size) fail("{}: header not read completely", source);

  // Duplicate top-level names are rejected while parsing (the JSON library would keep only the last one).
  std::set<std::string> seen;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (depth > 8) fail("{}: header JSON nested too deeply", source);
    if (depth == 1 && ev == nlohmann::json::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) fail("{}: tensor \"{}\" appears twice in the header", source, k);
    }
    return true;
  };
  nlohmann::json j;
  const char* begin = reinterpret_cast<const char*>(bytes + 8);
  try {
    j = nlohmann::json::parse(begin, begin + h.header_size, cb, true, false);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid UTF-8 JSON: {}", source, e.what());
  }
  if (!j.is_object()) fail("{}: header is not a JSON object", source);

  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is not a map of strings", source);
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) fail("{}: __metadata__ key \"{}\" is not a string", source, mk);
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(name, v, source));
  }
  // The reference sorts by offsets and requires each tensor to start where the previous one ended: no gaps,
  // no overlap, no two names on one byte range.
  std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const auto& e : h.entries) {
    if (e.begin != pos)
      fail("{}: tensor \"{}\": data_offsets [{}, {}] {} (expected it to start at {})", source, e.name, e.begin,
           e.end, e.begin < pos ? "overlap another tensor" : "leave a gap", pos);
    pos = e.end;
  }
  const uint64_t data_size = file_size - 8 - h.header_size;
  if (pos != data_size)
    fail("{}: the tensors cover {} bytes but the data section has {} ({})", source, pos, data_size,
         pos < data_size ? "trailing bytes" : "file truncated");
  for (size_t i = 0; i < h.entries.size(); ++i) h.by_name[h.entries[i].name] = i;
  return h;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct FdGuard {
    int fd;
    ~FdGuard() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);

  // The header is read with pread (not through the mapping) and validated against st_size before anything
  // is mapped, so a truncated file is refused instead of faulting later.
  uint8_t prefix[8] = {};
  const size_t got = size >= 8 ? static_cast<size_t>(pread(fd, prefix, 8, 0)) : 0;
  if (size < 8 || got != 8) fail("{}: header too small ({} bytes; a safetensors file starts with 8)", path, size);
  const uint64_t n = read_u64_le(prefix);
  if (n > kSafetensorsMaxHeader) fail("{}: header too large ({} bytes, limit {})", path, n, kSafetensorsMaxHeader);
  if (8 + n > size) fail("{}: invalid header length {} for a file of {} bytes", path, n, size);
  std::vector<uint8_t> head(8 + n);
  std::memcpy(head.data(), prefix, 8);
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, head.data() + 8 + done, n - done, static_cast<off_t>(8 + done));
    if (r <= 0) fail("{}: read error in header", path);
    done += static_cast<size_t>(r);
  }
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  f->header_ = parse_safetensors_header(head.data(), head.size(), size, path);
  f->size_ = size;
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(errno));
  f->base_ = static_cast<const uint8_t*>(p);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
}

}  // namespace fern
