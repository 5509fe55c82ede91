#include "nccl_plugin/nccl_version.h"

#include <dlfcn.h>

namespace rs::nccl {

namespace {

int call_get_version(void* sym) noexcept {
  if (!sym) return 0;
  int v = 0;
  if (reinterpret_cast<ncclGetVersion_t>(sym)(&v) != ncclSuccess) return 0;
  return v > 0 ? v : 0;
}

// ncclGetVersion of the shared object that contains `addr` (already mapped: RTLD_NOLOAD never
// loads anything; the extra reference is dropped at once).
int version_from_object_of(const void* addr) noexcept {
  Dl_info info{};
  if (!addr || dladdr(addr, &info) == 0 || !info.dli_fname || !info.dli_fname[0]) return 0;
  void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  int v = call_get_version(dlsym(h, "ncclGetVersion"));
  dlclose(h);
  return v;
}

}  // namespace

int loading_nccl_version(ncclDebugLogger_t logger) noexcept {
  int v = version_from_object_of(reinterpret_cast<const void*>(logger));
  if (!v) v = call_get_version(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  return v;
}

std::string nccl_version_text(int code) {
  if (code <= 0) return "unknown";
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

int newest_collnet_version(int code) {
  // From each release's loader (docs/nccl-plugin.md, "Versions").
  if (code >= 21900 && code < 22000) return 7;
  if (code >= 22000 && code < 22400) return 8;
  if (code >= 22400 && code < 22600) return 9;
  if (code >= 22600 && code < 22800) return 10;
  if (code >= 22800 && code < 23000) return 11;
  if (code >= 23000 && code < 23100) return 12;
  return 0;
}

bool collnet_table_used_directly(int table, int code) {
  // Every NCCL searches the CollNet versions it knows newest first, knows a contiguous range of
  // them, and uses its newest as it is. This library exports v7-v12, so an NCCL that finds our
  // v8, v9, v10 or v11 does not know the next one up: that table is its newest (v8: 2.20-2.23,
  // v9: 2.24-2.25, v10: 2.26-2.27, v11: 2.28-2.29). Only v12, our newest, may meet an NCCL
  // that knows more and wraps it.
  if (table >= 7 && table < kNewestCollNetExported) return true;
  const int newest = newest_collnet_version(code);
  // Unknown or newer NCCL: assume an adapter. A refusal is an error NCCL reports; a NULL member
  // behind an adapter would be a jump to address 0.
  return newest != 0 && newest == table;
}

}  // namespace rs::nccl
