// What the exported net and CollNet tables share: the device's properties in each version's
// layout (v12 is filled, older layouts are converted from it) and host-memory registration.
// Every function here is an entry point or runs inside one: nothing throws past it.
#pragma once

#include <cstddef>

#include "nccl_plugin/nccl_abi.h"

#define RS_EXPORT __attribute__((visibility("default")))

namespace rs::nccl {

constexpr const char* kPluginName = "reduction-server";

enum class Side { Net, CollNet };

// The one NIC's properties, v12 layout; throws Config for a device that does not exist
// (Net: always one; CollNet: one with a reducer pool, else none).
void fill_properties(Side side, int dev, ncclNetProperties_v12_t* p);

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v12_t* p);
void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v11_t* p);
void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v10_t* p);  // v9 too: the same layout
void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v8_t* p);
void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v7_t* p);

// getProperties of any version: fills v12, converts into `props`.
template <class Props>
ncclResult_t get_properties(Side side, int dev, Props* props) noexcept;

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept;
ncclResult_t reg_mr_v7(void* comm, void* data, int size, int type, void** mhandle) noexcept;  // int size
ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) noexcept;
ncclResult_t dereg_mr(void* comm, void* mhandle) noexcept;

extern template ncclResult_t get_properties(Side, int, ncclNetProperties_v12_t*) noexcept;
extern template ncclResult_t get_properties(Side, int, ncclNetProperties_v11_t*) noexcept;
extern template ncclResult_t get_properties(Side, int, ncclNetProperties_v10_t*) noexcept;
extern template ncclResult_t get_properties(Side, int, ncclNetProperties_v8_t*) noexcept;
extern template ncclResult_t get_properties(Side, int, ncclNetProperties_v7_t*) noexcept;

}  // namespace rs::nccl
