// The scratch arena's two forms (scratch_arena.h). The contiguous form uses the driver's virtual memory calls,
// reached through the runtime's entry-point query so that fern links the runtime only (no libcuda at link time).
#include "cuda/scratch_arena.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"

namespace fern::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kBlock = size_t(256) << 20;
// The contiguous form maps at least this much at a time: few driver calls while the first calls size the arena, at
// most this much above the live peak.
constexpr size_t kGrowStep = size_t(64) << 20;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

#if CUDART_VERSION >= 12050
// The driver's virtual memory calls, or all null where the driver lacks them.
struct Vmm {
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;

  bool complete() const {
    return device_get && attribute && granularity && reserve && address_free && create && release && map && unmap &&
           set_access;
  }
};

template <class F>
void lookup(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) == cudaSuccess &&
      status == cudaDriverEntryPointSuccess)
    fn = reinterpret_cast<F>(p);
}

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm r;
    lookup("cuDeviceGet", r.device_get);
    lookup("cuDeviceGetAttribute", r.attribute);
    lookup("cuMemGetAllocationGranularity", r.granularity);
    lookup("cuMemAddressReserve", r.reserve);
    lookup("cuMemAddressFree", r.address_free);
    lookup("cuMemCreate", r.create);
    lookup("cuMemRelease", r.release);
    lookup("cuMemMap", r.map);
    lookup("cuMemUnmap", r.unmap);
    lookup("cuMemSetAccess", r.set_access);
    return r;
  }();
  return v;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
#endif

}  // namespace

ScratchArena::ScratchArena(int device, Form want) : device_(device) {
#if CUDART_VERSION >= 12050
  if (want != Form::Contiguous) return;
  const Vmm& v = vmm();
  if (!v.complete()) return;
  CUdevice dev = 0;
  int supported = 0;
  if (v.device_get(&dev, device) != CUDA_SUCCESS ||
      v.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS ||
      !supported)
    return;
  const CUmemAllocationProp prop = device_prop(device);
  size_t gran = 0;
  if (v.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || gran == 0) return;
  size_t free_b = 0, total_b = 0;
  FERN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  // Addresses for all of the device's memory: the arena can never need more, and a reservation costs no memory.
  const size_t range = round_up(total_b, gran);
  CUdeviceptr base = 0;
  if (v.reserve(&base, range, 0, 0, 0) != CUDA_SUCCESS) return;
  base_ = base;
  range_ = range;
  granularity_ = gran;
  form_ = Form::Contiguous;
#else
  (void)want;
#endif
}

ScratchArena::~ScratchArena() {
  for (const Block& b : blocks_) cudaFree(b.p);
#if CUDART_VERSION >= 12050
  if (form_ == Form::Contiguous) {
    const Vmm& v = vmm();
    size_t at = 0;
    for (const auto& [h, size] : handles_) {  // each mapping whole, as it was made
      v.unmap(base_ + at, size);
      v.release(h);
      at += size;
    }
    v.address_free(base_, range_);
  }
#endif
}

size_t ScratchArena::reserved() const {
  if (form_ == Form::Contiguous) return mapped_;
  size_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

void ScratchArena::release(Mark m) {
  block_ = m.block;
  off_ = m.off;
  live_ = m.live;
  live_sizes_.resize(m.count);
}

void* ScratchArena::alloc(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1), kAlign);
  void* p = form_ == Form::Contiguous ? alloc_contiguous(bytes) : alloc_blocks(bytes);
  live_ += bytes;
  live_sizes_.push_back(bytes);
  if (live_ > live_peak_) {
    live_peak_ = live_;
    peak_sizes_ = live_sizes_;
  }
  return p;
}

void* ScratchArena::alloc_blocks(size_t bytes) {
  while (block_ < blocks_.size()) {
    Block& b = blocks_[block_];
    if (off_ + bytes <= b.size) {
      void* p = static_cast<char*>(b.p) + off_;
      off_ += bytes;
      return p;
    }
    ++block_;
    off_ = 0;
  }
  FERN_CU_CHECK(growth_allowed_, "scratch arena grew during graph capture: run the step once eagerly before capturing");
  Block b{nullptr, std::max(bytes, kBlock)};
  FERN_CUDA_CHECK(cudaMalloc(&b.p, b.size));
  blocks_.push_back(b);
  block_ = blocks_.size() - 1;
  off_ = bytes;
  return b.p;
}

void* ScratchArena::alloc_contiguous(size_t bytes) {
  const size_t end = off_ + bytes;
  if (end > mapped_) {
    FERN_CU_CHECK(growth_allowed_,
                  "scratch arena grew during graph capture: run the step once eagerly before capturing");
    grow_contiguous(end);
  }
  void* p = reinterpret_cast<void*>(base_ + off_);
  off_ = end;
  return p;
}

void ScratchArena::grow_contiguous(size_t end) {
#if CUDART_VERSION >= 12050
  if (end > range_)
    raise_error("out of device memory: scratch of " + std::to_string(end) + " bytes exceeds the device's " +
                std::to_string(range_));
  const Vmm& v = vmm();
  const size_t size = std::min(round_up(std::max(end - mapped_, kGrowStep), granularity_), range_ - mapped_);
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = v.create(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS)
    raise_error("out of device memory: scratch arena could not grow by " + std::to_string(size) + " bytes (driver " +
                "error " + std::to_string(int(r)) + ")");
  const CUdeviceptr at = base_ + mapped_;
  r = v.map(at, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    v.release(h);
    raise_error("scratch arena: mapping " + std::to_string(size) + " bytes failed (driver error " +
                std::to_string(int(r)) + ")");
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = v.set_access(at, size, &access, 1);
  if (r != CUDA_SUCCESS) {
    v.unmap(at, size);
    v.release(h);
    raise_error("scratch arena: enabling access to " + std::to_string(size) + " bytes failed (driver error " +
                std::to_string(int(r)) + ")");
  }
  handles_.emplace_back(h, size);
  mapped_ += size;
#else
  (void)end;
  raise_internal("contiguous scratch arena without driver VMM support");
#endif
}

}  // namespace fern::cuda
