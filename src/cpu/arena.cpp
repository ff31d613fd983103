#include "cpu/arena.h"

#include <algorithm>

namespace fern::cpu {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* Arena::alloc(size_t bytes) {
  const size_t need = round_up(std::max<size_t>(bytes, 1));
  if (blocks_.empty() || blocks_.back().used + need > blocks_.back().mem.size()) {
    // A new block at least as large as everything so far, so the number of blocks grows only logarithmically.
    const size_t size = round_up(std::max({need, first_block_, capacity()}));
    blocks_.push_back(Block{HostBuffer(size), 0});
  }
  Block& b = blocks_.back();
  void* p = static_cast<char*>(b.mem.data()) + b.used;
  b.used += need;
  return p;
}

void Arena::reset() {
  if (blocks_.size() > 1) {
    const size_t total = capacity();
    blocks_.clear();
    blocks_.push_back(Block{HostBuffer(total), 0});
  }
  for (Block& b : blocks_) b.used = 0;
}

void Arena::release(Mark m) {
  for (size_t i = m.blocks; i < blocks_.size(); ++i) blocks_[i].used = 0;
  if (m.blocks > 0 && m.blocks == blocks_.size()) blocks_.back().used = m.used;
}

size_t Arena::capacity() const {
  size_t n = 0;
  for (const Block& b : blocks_) n += b.mem.size();
  return n;
}

}  // namespace fern::cpu
