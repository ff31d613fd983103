// Scratch arena of the CPU backend: a bump allocator over a chain of blocks. reset() makes every block free
// again (and merges a chain into one block of the total size, so a steady workload settles on one block and the
// same addresses); a tensor handed out stays valid until the next reset().
#pragma once
#include <cstddef>
#include <vector>

#include "core/tensor.h"

namespace fern::cpu {

class Arena {
 public:
  explicit Arena(size_t first_block_bytes = size_t(16) << 20) : first_block_(first_block_bytes) {}
  void* alloc(size_t bytes);
  void reset();
  // A position, and a return to it: allocations made after the mark are free again (a block added after the mark
  // is emptied; the rest of the marked block stays unused until reset()).
  struct Mark {
    size_t blocks, used;
  };
  Mark mark() const { return {blocks_.size(), blocks_.empty() ? 0 : blocks_.back().used}; }
  void release(Mark m);
  size_t capacity() const;

 private:
  struct Block {
    HostBuffer mem;
    size_t used = 0;
  };
  size_t first_block_;
  std::vector<Block> blocks_;
};

}  // namespace fern::cpu
