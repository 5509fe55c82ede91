// Delegation of point-to-point traffic to another NCCL net plugin (RS_NCCL_P2P_PLUGIN).
//
// With RS_NCCL_P2P_PLUGIN=<library> set, the first init of a net table of version N dlopens the
// library (once per process, RTLD_NOW | RTLD_LOCAL), looks up its ncclNetPlugin_vN (the version
// NCCL asked this library for) and, when found, every member of this library's vN net table
// forwards to it: the point-to-point traffic then runs over gIB / TCPX / aws-ofi-nccl, while
// the CollNet tables stay this project's. A library that does not load, lacks ncclNetPlugin_vN
// or is this library itself: one WARN naming the reason and the versions it does export, and
// the built-in TCP net serves (NCCL's job runs, its p2p traffic on TCP); the same when the
// delegate's first init fails (a gIB plugin on a machine without its NICs). The delegate is
// dlclosed when this library is unloaded.
#pragma once

#include <atomic>
#include <string>

#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl::delegate {

// The adopted delegate table of type T (ncclNet_vN_t), nullptr while the built-in net serves.
template <class T>
inline std::atomic<const T*> g_table{nullptr};

// Set once a delegate of this version was refused after adoption (its first init failed).
template <class T>
inline std::atomic<bool> g_refused{false};

template <class T>
const T* active() noexcept {
  return g_table<T>.load(std::memory_order_acquire);
}

// The delegate's first init failed: the built-in net serves this version from now on.
template <class T>
void drop() noexcept {
  g_refused<T>.store(true, std::memory_order_release);
  g_table<T>.store(nullptr, std::memory_order_release);
}

// Resolves RS_NCCL_P2P_PLUGIN for version `version` (idempotent; the first call decides) and
// returns the delegate's table, or nullptr (built-in). `self` is this library's own table of
// that version (a delegate that resolves to it is refused). Never throws.
const ncclNet_v7_t* resolve(const ncclNet_v7_t* self) noexcept;
const ncclNet_v8_t* resolve(const ncclNet_v8_t* self) noexcept;
const ncclNet_v10_t* resolve(const ncclNet_v10_t* self) noexcept;
const ncclNet_v11_t* resolve(const ncclNet_v11_t* self) noexcept;
const ncclNet_v12_t* resolve(const ncclNet_v12_t* self) noexcept;

// "ncclNetPlugin_vN" symbols a library handle exports, newest first ("v12 v11 v8"); "" if none.
std::string exported_versions(void* handle);

}  // namespace rs::nccl::delegate
