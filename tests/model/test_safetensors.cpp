// safetensors header validation (RELIABILITY.md 3 A, cases T01-T10 and T17): every malformed file is refused
// with a message naming the file (and the tensor where there is one), never a crash; valid corner cases
// (empty tensors, scalars, padded headers) are accepted. Also the writer -> reader round trip.
// fern-test-labels: parser
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "test_util.h"

namespace fern {
namespace {

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file: 8-byte length, the header text, then `data_bytes` bytes of data (a non-zero pattern).
std::string file_bytes(const std::string& header, size_t data_bytes) {
  std::string s = u64le(header.size()) + header;
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(1 + i % 251));
  return s;
}

SafetensorsHeader parse_bytes(const std::string& bytes) {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(),
                                  "bad.safetensors");
}

// Expects a clean rejection whose message holds every one of `needles`.
void expect_reject(const std::string& bytes, std::initializer_list<const char*> needles) {
  try {
    parse_bytes(bytes);
    ADD_FAILURE() << "accepted; expected an error mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.safetensors"), std::string::npos) << m;
    for (const char* n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m;
  }
}

const std::string kOne = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";

TEST(Safetensors, ValidFileAndCornerCases) {
  SafetensorsHeader h = parse_bytes(file_bytes(kOne, 24));
  ASSERT_EQ(h.entries.size(), 1u);
  EXPECT_EQ(h.entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.entries[0].dtype, DType::F32);
  // Leading/trailing spaces, metadata, an empty tensor and a 0-rank scalar (T17), entries given out of order.
  const std::string h2 = "  " + std::string(R"({"__metadata__":{"format":"pt"},)") +
                         R"("s":{"dtype":"BF16","shape":[],"data_offsets":[4,6]},)" +
                         R"("e":{"dtype":"F32","shape":[0,7],"data_offsets":[4,4]},)" +
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})" + "    ";
  h = parse_bytes(file_bytes(h2, 6));
  ASSERT_EQ(h.entries.size(), 3u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.find("s")->shape.size(), 0u);
  EXPECT_EQ(h.find("e")->numel(), 0);
  // A dtype the engine has no type for still validates (its size is known).
  h = parse_bytes(file_bytes(R"({"x":{"dtype":"F8_E4M3","shape":[5],"data_offsets":[0,5]}})", 5));
  EXPECT_FALSE(h.entries[0].dtype.has_value());
}

TEST(Safetensors, T01_TooSmall) {
  for (size_t n = 0; n < 8; ++n) expect_reject(std::string(n, '\x01'), {"header too small"});
}

TEST(Safetensors, T02_HeaderLengthBeyondFile) {
  std::string s = u64le(1000) + std::string(92, ' ');
  expect_reject(s, {"invalid header length"});
}

TEST(Safetensors, T03_HeaderTooLarge) {
  for (uint64_t n : {uint64_t(1) << 63, ~uint64_t(0), uint64_t(100'000'001)})
    expect_reject(u64le(n) + "{}", {"header too large"});
}

TEST(Safetensors, T04_NotJsonObject) {
  for (std::string h : {std::string("{\"a\xff\":1}"), std::string("\xff{}"), std::string("hello"),
                        std::string("{\"a\":"), std::string("[1,2]"), std::string("42"), std::string("{}\0\0", 4),
                        std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x)")})
    expect_reject(file_bytes(h, 4), {});
}

TEST(Safetensors, T05_T06_CoverageOfDataSection) {
  expect_reject(file_bytes(kOne, 20), {"file truncated"});
  expect_reject(file_bytes(kOne, 25), {"trailing bytes"});
  // A gap between two tensors.
  expect_reject(file_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                           12),
                {"\"b\"", "gap"});
}

TEST(Safetensors, T07_Offsets) {
  auto one = [](const std::string& offsets, const std::string& shape = "[4]") {
    return R"({"a":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  expect_reject(file_bytes(one("[4,0]"), 4), {"\"a\"", "end before begin"});
  expect_reject(file_bytes(one("[-1,3]"), 4), {"\"a\"", "data_offsets"});
  expect_reject(file_bytes(one("[0.0,4]"), 4), {"\"a\"", "data_offsets"});
  expect_reject(file_bytes(one("[\"0\",4]"), 4), {"\"a\"", "data_offsets"});
  expect_reject(file_bytes(one("[0]"), 4), {"\"a\"", "data_offsets"});
  expect_reject(file_bytes(one("[0,4,8]"), 4), {"\"a\"", "data_offsets"});
  expect_reject(file_bytes(one("[0,4]"), 2), {"file truncated"});
  // Overlap, and ten names on one byte range (the aliasing attack).
  expect_reject(file_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                           6),
                {"overlap"});
  std::string alias = "{";
  for (int i = 0; i < 10; ++i) {
    if (i) alias += ",";
    alias += "\"t" + std::to_string(i) + R"(":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  }
  expect_reject(file_bytes(alias + "}", 4), {"overlap"});
}

TEST(Safetensors, T08_ShapeAgainstSpan) {
  auto one = [](const std::string& shape, const std::string& off = "[0,4]") {
    return R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + off + "}}";
  };
  expect_reject(file_bytes(one("[2]"), 4), {"\"w\"", "needs 8"});
  expect_reject(file_bytes(one("[2,9223372036854775808]"), 4), {"\"w\""});
  expect_reject(file_bytes(one("[4294967296,4294967296]"), 4), {"\"w\"", "overflow"});
  expect_reject(file_bytes(one("[1152921504606846976]"), 4), {"\"w\"", "overflow"});  // 2^60 x 4 bytes
  expect_reject(file_bytes(one("[-1]"), 4), {"\"w\"", "shape"});
  expect_reject(file_bytes(one("[1.5]"), 4), {"\"w\"", "shape"});
  expect_reject(file_bytes(one("[1,1,1,1,1,1,1,1,1]"), 4), {"\"w\"", "rank 9"});
  expect_reject(file_bytes(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), {"byte boundary"});
}

TEST(Safetensors, T09_UnknownDtype) {
  for (const char* dt : {"F128", "object", "bf16", ""})
    expect_reject(file_bytes(std::string(R"({"w":{"dtype":")") + dt + R"(","shape":[1],"data_offsets":[0,4]}})", 4),
                  {"\"w\"", "dtype"});
  expect_reject(file_bytes(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4), {"\"w\"", "dtype"});
  expect_reject(file_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), {"\"w\"", "missing"});
  expect_reject(file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4), {"\"w\""});
  expect_reject(file_bytes(R"({"w":[1]})", 4), {"\"w\""});
}

TEST(Safetensors, T10_DuplicatesAndMetadata) {
  expect_reject(file_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                           R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                           4),
                {"\"w\"", "twice"});
  expect_reject(file_bytes(R"({"__metadata__":{"a":1}})", 0), {"__metadata__"});
  expect_reject(file_bytes(R"({"__metadata__":["a"]})", 0), {"__metadata__"});
}

// Seeded random corruption of a valid two-tensor file (byte flips in the header, truncation, a new length
// field): every result is either a clean parse whose entries tile the data section or a fern::Error; under
// ASan/UBSan (label parser) this also shows no out-of-bounds read.
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  const std::string good = file_bytes(R"({"__metadata__":{"format":"mlx"},"a":{"dtype":"BF16","shape":[3,4],)"
                                      R"("data_offsets":[0,24]},"b":{"dtype":"U32","shape":[2],"data_offsets":[24,32]}})",
                                      32);
  std::mt19937_64 rng(12345);
  int accepted = 0, refused = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string f = good;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // flip a few header bytes to random printable or arbitrary values
      for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
        f[8 + rng() % (f.size() - 8 - 32)] = static_cast<char>(rng() % 2 ? 32 + rng() % 95 : rng() % 256);
    } else if (kind == 1) {
      f.resize(rng() % f.size());
    } else if (kind == 2) {
      const std::string len = u64le(rng() % 2 ? rng() % 300 : rng());
      std::memcpy(f.data(), len.data(), 8);
    } else {  // a digit of an offset or a dimension changed
      size_t at = f.find_first_of("0123456789", 8 + rng() % 60);
      if (at != std::string::npos && at < f.size() - 32) f[at] = static_cast<char>('0' + rng() % 10);
    }
    try {
      SafetensorsHeader h = parse_bytes(f);
      uint64_t end = 0;
      for (const auto& e : h.entries) end = std::max(end, e.end);
      EXPECT_EQ(h.data_offset() + end, f.size());
      ++accepted;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 0);  // some flips land in ignorable places (metadata text, spaces)
}

TEST(Safetensors, OpenFromDisk) {
  const std::string d = test::temp_dir("st");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(d + "/" + name, std::ios::binary) << bytes;
    return d + "/" + name;
  };
  auto f = SafetensorsFile::open(write("ok.safetensors", file_bytes(kOne, 24)));
  ASSERT_NE(f->find("a"), nullptr);
  EXPECT_EQ(f->data(*f->find("a"))[0], 1);
  EXPECT_EQ(f->data(*f->find("a"))[23], 24);
  for (const std::string& bytes : {std::string("abc"), file_bytes(kOne, 20), u64le(uint64_t(1) << 63)}) {
    const std::string p = write("bad.safetensors", bytes);
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(SafetensorsFile::open(d + "/missing.safetensors"), Error);
  EXPECT_THROW(SafetensorsFile::open(d), Error);  // a directory
}

TEST(Safetensors, WriterRoundTrip) {
  // Two tensors whose bytes are a function of the row, written in blocks of one row to exercise offsets.
  std::vector<StreamTensor> ts(2);
  ts[0].parts = {{"x.weight", DType::U32, {5, 3}}, {"x.scales", DType::BF16, {5, 2}}};
  ts[0].rows = 5;
  ts[1].parts = {{"y", DType::F32, {7}}};
  ts[1].rows = 1;
  for (auto& t : ts) {
    t.fill = [&t](int64_t row0, int64_t n, uint8_t* const* dst) {
      for (size_t p = 0; p < t.parts.size(); ++p)
        for (uint64_t i = 0; i < n * t.row_bytes(p); ++i)
          dst[p][i] = static_cast<uint8_t>(31 * p + row0 * t.row_bytes(p) + i + 1);
    };
  }
  for (uint64_t shard : {uint64_t(1) << 30, uint64_t(40)}) {
    const std::string d = test::temp_dir("stw");
    ShardWriteOptions o;
    o.block_bytes = 1;
    o.max_shard_bytes = shard;
    const auto names = write_safetensors(d, ts, o);
    EXPECT_EQ(names.size(), shard > 1000 ? 1u : 4u);  // 60 + 20 + 28 bytes under a 40-byte cap: 3 shards + index
    int found = 0;
    for (const auto& n : names) {
      if (n.find(".index.json") != std::string::npos) continue;
      auto f = SafetensorsFile::open(d + "/" + n);
      EXPECT_EQ(f->header().metadata.at("format"), "mlx");
      EXPECT_EQ(f->header().data_offset() % 8, 0u);  // the header is padded so the data starts aligned
      for (const auto& t : ts)
        for (size_t p = 0; p < t.parts.size(); ++p) {
          const SafetensorsEntry* e = f->find(t.parts[p].name);
          if (!e) continue;
          ++found;
          EXPECT_EQ(e->shape, t.parts[p].shape);
          const uint8_t* b = f->data(*e);
          for (uint64_t i = 0; i < t.parts[p].nbytes(); ++i)
            ASSERT_EQ(b[i], static_cast<uint8_t>(31 * p + i + 1)) << t.parts[p].name << " byte " << i;
        }
    }
    EXPECT_EQ(found, 3);
  }
}

}  // namespace
}  // namespace fern
