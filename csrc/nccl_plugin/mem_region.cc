#include "nccl_plugin/mem_region.h"

#include <memory>
#include <string>

#include "common/error.h"
#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl {

void* register_region(void* data, size_t size, int type) {
  if (type != NCCL_PTR_HOST)
    throw Error(ErrorKind::Config,
                std::string("cannot register ") + (type == NCCL_PTR_CUDA ? "CUDA" : "non-host") +
                    " memory: this plugin moves data from host memory only (ptrSupport = NCCL_PTR_HOST); "
                    "NCCL stages GPU buffers through host memory when the plugin says so");
  if (!data && size)
    throw Error(ErrorKind::Config, "cannot register a null pointer of " + std::to_string(size) + " bytes");
  auto r = std::make_unique<MemRegion>();
  r->base = static_cast<const uint8_t*>(data);
  r->size = size;
  return r.release();  // owned by NCCL until deregMr
}

void deregister_region(void* mhandle) {
  if (!mhandle) return;
  if (!region_of(mhandle)) throw Error(ErrorKind::Internal, "deregMr: not a memory handle of this plugin");
  std::unique_ptr<MemRegion> r(static_cast<MemRegion*>(mhandle));
  r->magic = 0;
}

const MemRegion* region_of(const void* mhandle) {
  auto* r = static_cast<const MemRegion*>(mhandle);
  return r && r->magic == MemRegion::kMagic ? r : nullptr;
}

}  // namespace rs::nccl
