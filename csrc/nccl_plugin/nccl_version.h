// Which NCCL loaded this library, and what that means for the tables it exports.
//
// NCCL uses the newest table version it knows as it is, and wraps an older one in an adapter
// (src/net.cc up to 2.25, src/plugin/net/net_vN.cc from 2.26). That matters for CollNet's
// iallgather / ireducescatter: NCCL's tuner (src/graph/tuning.cc) rules CollNet out for
// all-gather / reduce-scatter only when the member it holds is NULL, while every adapter sets
// its own member and calls the plugin's unconditionally. So a table NCCL uses as it is must
// carry NULL there, and a table behind an adapter a function that refuses (docs/nccl-plugin.md).
// Exporting every version from v7 to v12 makes each release up to 2.30 find its own newest, which
// it uses as it is: only v12 can meet an adapter (an NCCL newer than 2.30).
#pragma once

#include <string>

#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl {

// NCCL_VERSION_CODE (2.28.3 -> 22803) of the NCCL in this process: ncclGetVersion from the
// object that holds NCCL's logger (NCCL loaded with RTLD_LOCAL, as PyTorch does), else from the
// global scope; 0 when neither has it (a static NCCL that hides the symbol). Never throws.
int loading_nccl_version(ncclDebugLogger_t logger) noexcept;

std::string nccl_version_text(int code);  // "2.28.3", "unknown"

// The newest CollNet table version NCCL `code` searches; 0 for an unknown or unreleased NCCL
// (newer than 2.30, the newest this plugin was checked against).
int newest_collnet_version(int code);

// The newest CollNet (and net) table version this library exports.
constexpr int kNewestCollNetExported = 12;

// Whether NCCL `code` uses our CollNet table of version `table` as it is (true: iallgather /
// ireducescatter must be NULL) or behind an adapter (false: they must be callable).
bool collnet_table_used_directly(int table, int code);

}  // namespace rs::nccl
