#include "nccl_plugin/p2p_delegate.h"

#include <dlfcn.h>

#include <mutex>

#include "common/settings.h"
#include "nccl_plugin/plugin_env.h"
#include "nccl_plugin/plugin_log.h"

extern "C" ncclNet_v12_t ncclNetPlugin_v12;  // exports_net.cc

namespace rs::nccl::delegate {
namespace {

constexpr int kVersionsSearched[] = {12, 11, 10, 9, 8, 7, 6, 5};

// The delegate library, loaded at most once per load of this library.
class Library {
 public:
  ~Library() {
    if (handle_) ::dlclose(handle_);
  }

  // The library's handle, loading it on the first call; nullptr when none is set or it failed.
  void* handle() {
    if (tried_) return handle_;
    tried_ = true;
    auto path = settings::read_text(settings::spec("nccl_p2p_plugin"), settings::process_env());
    if (!path) return nullptr;
    path_ = *path;
    ::dlerror();
    handle_ = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* err = ::dlerror();
      log_warn("RS_NCCL_P2P_PLUGIN=" + path_ + " cannot be loaded (" + (err ? err : "unknown error") +
               "): point-to-point traffic uses the built-in TCP net");
    }
    return handle_;
  }

  const std::string& path() const { return path_; }

  // Called when the library resolved to this one: drop the extra reference now (this library's
  // own destructor must not dlclose itself).
  void release_self() {
    if (handle_) ::dlclose(handle_);
    handle_ = nullptr;
  }

 private:
  bool tried_ = false;
  void* handle_ = nullptr;
  std::string path_;
};

std::mutex g_mu;
Library g_lib;

bool is_self(void* handle) {
  // This library's own v12 table found through the handle: it is this library.
  return ::dlsym(handle, "ncclNetPlugin_v12") == static_cast<void*>(&ncclNetPlugin_v12);
}

template <class T>
const T* resolve_impl(int version, const T* self) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_mu);
    if (const T* t = active<T>()) return t;
    if (g_refused<T>.load(std::memory_order_acquire)) return nullptr;
    void* h = g_lib.handle();
    if (!h) return nullptr;
    const std::string sym = "ncclNetPlugin_v" + std::to_string(version);
    auto* t = static_cast<const T*>(::dlsym(h, sym.c_str()));
    if (t == self || is_self(h)) {
      log_warn("RS_NCCL_P2P_PLUGIN=" + g_lib.path() +
               " is this library itself: point-to-point traffic uses the "
               "built-in TCP net");
      g_lib.release_self();
      return nullptr;
    }
    if (!t) {
      const std::string has = exported_versions(h);
      log_warn("RS_NCCL_P2P_PLUGIN=" + g_lib.path() + " has no " + sym + " (NCCL loaded this library's v" +
               std::to_string(version) + " net; the delegate exports " + (has.empty() ? "no net table" : has) +
               "): point-to-point traffic uses the built-in TCP net");
      return nullptr;
    }
    if (!t->init || !t->devices || !t->getProperties || !t->listen || !t->connect || !t->accept || !t->regMr ||
        !t->deregMr || !t->isend || !t->irecv || !t->test || !t->closeSend || !t->closeRecv || !t->closeListen) {
      log_warn("RS_NCCL_P2P_PLUGIN=" + g_lib.path() + ": its " + sym +
               " lacks a required member: point-to-point "
               "traffic uses the built-in TCP net");
      return nullptr;
    }
    log_info("point-to-point traffic delegated to RS_NCCL_P2P_PLUGIN=" + g_lib.path() + " (its net '" +
             std::string(t->name ? t->name : "?") + "', " + sym + "; it exports " + exported_versions(h) +
             "); CollNet stays reduction-server's");
    g_table<T>.store(t, std::memory_order_release);
    return t;
  } catch (...) {
    return nullptr;  // logging failed (out of memory): the built-in net serves
  }
}

}  // namespace

std::string exported_versions(void* handle) {
  std::string out;
  for (int v : kVersionsSearched) {
    const std::string sym = "ncclNetPlugin_v" + std::to_string(v);
    if (::dlsym(handle, sym.c_str())) out += (out.empty() ? "v" : " v") + std::to_string(v);
  }
  return out;
}

const ncclNet_v7_t* resolve(const ncclNet_v7_t* self) noexcept { return resolve_impl(7, self); }
const ncclNet_v8_t* resolve(const ncclNet_v8_t* self) noexcept { return resolve_impl(8, self); }
const ncclNet_v10_t* resolve(const ncclNet_v10_t* self) noexcept { return resolve_impl(10, self); }
const ncclNet_v11_t* resolve(const ncclNet_v11_t* self) noexcept { return resolve_impl(11, self); }
const ncclNet_v12_t* resolve(const ncclNet_v12_t* self) noexcept { return resolve_impl(12, self); }

}  // namespace rs::nccl::delegate
