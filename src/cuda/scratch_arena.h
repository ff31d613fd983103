// The CUDA backend's scratch arena: a bump allocator with stack marks, reset at the start of every forward call (so a
// replayed decode step sees the same addresses).
//
// Contiguous form (the default where the device supports virtual memory management): one range of virtual addresses
// the size of the device's memory is reserved up front, and physical memory is mapped onto its end as the arena
// grows. Addresses never move and nothing is freed, so what it holds is the largest amount any forward call had live
// at once (rounded up to the growth step).
//
// Block form (FERN_CUDA_SCRATCH=blocks, or no VMM support): a chain of cudaMalloc blocks of at least 256 MiB, each
// allocation in the first block from the current one on with room for it. A block sized for one call's allocation
// sequence is skipped, not reused, by a later call whose sizes differ (a longer KV prefix, a larger chunk), so it
// holds ~1.8x the live peak on a chunked prefill (measured: 3.06 GB reserved for a 1.67 GB peak at 8,192-token
// chunks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fern::cuda {

class ScratchArena {
 public:
  enum class Form { Contiguous, Blocks };
  // `want` is the preferred form; Contiguous falls back to Blocks where the device or driver lacks VMM.
  ScratchArena(int device, Form want);
  ~ScratchArena();
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // 256-byte aligned, never null; throws fern::Error when the device is out of memory, fern::InternalError when the
  // arena would have to grow while growth is forbidden (during a graph capture).
  void* alloc(size_t bytes);
  // Every allocation made since the mark is free again.
  struct Mark {
    size_t block, off, live, count;
  };
  Mark mark() const { return {block_, off_, live_, live_sizes_.size()}; }
  void release(Mark m);
  // All allocations free (the start of a forward call).
  void reset() { release(Mark{0, 0, 0, 0}); }
  void set_growth_allowed(bool allowed) { growth_allowed_ = allowed; }

  Form form() const { return form_; }
  // Device memory the arena holds (it never shrinks).
  size_t reserved() const;
  // The most bytes of allocations (aligned) live at once since construction, and their sizes in allocation order.
  size_t live_peak() const { return live_peak_; }
  const std::vector<size_t>& peak_sizes() const { return peak_sizes_; }

 private:
  void* alloc_blocks(size_t bytes);
  void* alloc_contiguous(size_t bytes);
  void grow_contiguous(size_t end);  // maps memory until [0, end) is backed

  int device_;
  Form form_ = Form::Blocks;
  bool growth_allowed_ = true;
  size_t block_ = 0, off_ = 0;  // the bump position: block index (always 0 when contiguous) and offset in it
  size_t live_ = 0, live_peak_ = 0;
  std::vector<size_t> live_sizes_, peak_sizes_;
  struct Block {
    void* p;
    size_t size;
  };
  std::vector<Block> blocks_;  // block form
  // Contiguous form: the reserved range, the mapped prefix and its physical allocations (driver handles).
  uintptr_t base_ = 0;
  size_t range_ = 0, mapped_ = 0, granularity_ = 0;
  std::vector<std::pair<unsigned long long, size_t>> handles_;
};

}  // namespace fern::cuda
