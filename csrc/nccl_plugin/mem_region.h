// Registered memory of both nets: host memory only (the plugin reports ptrSupport =
// NCCL_PTR_HOST, so NCCL stages GPU data through pinned host buffers it registers here).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rs::nccl {

struct MemRegion {
  static constexpr uint32_t kMagic = 0x524d454du;  // "MEMR"
  uint32_t magic = kMagic;
  const uint8_t* base = nullptr;
  size_t size = 0;
  bool contains(const void* p, size_t n) const {
    auto* q = static_cast<const uint8_t*>(p);
    return q >= base && n <= size && size_t(q - base) <= size - n;
  }
};

// regMr: a handle for [data, data + size); throws rs::Error(Config) for CUDA / DMA-BUF memory.
void* register_region(void* data, size_t size, int type);
// deregMr: frees a handle from register_region (nullptr is ignored).
void deregister_region(void* mhandle);
// The region of a handle, or nullptr if the handle is not one of ours.
const MemRegion* region_of(const void* mhandle);

}  // namespace rs::nccl
