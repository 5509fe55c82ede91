// The point-to-point net tables NCCL looks up: ncclNetPlugin_v{7,8,10,11,12}. v12 is the
// implementation; the others are thin adapters (properties layout, int sizes, no context). v10
// is there for NCCL 2.26-2.27, which log the CollNet v10 table's name through their net v10
// pointer (exports_collnet.cc); 2.24-2.25 take v8 through their adapter (there is no v9 here).
// Every entry point goes through (run_)guarded(): no exception reaches NCCL.
// With RS_NCCL_P2P_PLUGIN set (p2p_delegate.h), every member forwards to the delegate's table
// of the same version instead (Fwd below); init decides, once per process.
#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

#include "nccl_plugin/exports_common.h"
#include "nccl_plugin/nccl_version.h"
#include "nccl_plugin/p2p_delegate.h"
#include "nccl_plugin/p2p_net.h"
#include "nccl_plugin/plugin_log.h"

extern "C" {
extern ncclNet_v12_t ncclNetPlugin_v12;
extern ncclNet_v11_t ncclNetPlugin_v11;
extern ncclNet_v10_t ncclNetPlugin_v10;
extern ncclNet_v8_t ncclNetPlugin_v8;
extern ncclNet_v7_t ncclNetPlugin_v7;
}

namespace rs::nccl {
namespace {

// Fwd<&Table::member, builtin>::call: the member's signature; the delegate's member when a
// delegate table of that version is adopted, else the built-in function.
template <auto Member, auto Builtin>
struct Fwd;
template <class T, class... A, ncclResult_t (*T::*Member)(A...), auto Builtin>
struct Fwd<Member, Builtin> {
  static ncclResult_t call(A... a) noexcept {
    if (const T* d = delegate::active<T>()) {
      if (auto fn = d->*Member) return fn(a...);
      return guarded("RS_NCCL_P2P_PLUGIN", []() -> ncclResult_t {
        throw Error(ErrorKind::Internal, "the delegate's net table has no member for this call");
      });
    }
    return Builtin(a...);
  }
};

// Which optional members a table version has beyond getDeviceMr / irecvConsumed.
template <class T>
constexpr bool kHasNetAttr = std::is_same_v<T, ncclNet_v11_t> || std::is_same_v<T, ncclNet_v12_t>;
template <class T>
constexpr bool kHasVDevice = kHasNetAttr<T> || std::is_same_v<T, ncclNet_v10_t>;

// The optional members (NCCL tests them for NULL) become the delegate's own, once.
template <class T>
void adopt_optional(T* own, const T* d) {
  static std::once_flag once;
  std::call_once(once, [&] {
    own->getDeviceMr = d->getDeviceMr;
    own->irecvConsumed = d->irecvConsumed;
    if constexpr (kHasVDevice<T>) own->makeVDevice = d->makeVDevice;
    if constexpr (kHasNetAttr<T>) own->setNetAttr = d->setNetAttr;
  });
}

// The delegate's table of this version (after installing NCCL's logger), or nullptr.
template <class T>
const T* delegate_for(T* own, ncclDebugLogger_t logger) {
  set_logger(logger);
  const T* d = delegate::resolve(own);
  if (d) adopt_optional(own, d);
  return d;
}

// After the delegate's init: a failure of its first init hands this version to the built-in net
// (NCCL would otherwise drop this whole library, CollNet too); later failures are NCCL's to see.
template <class T>
bool delegate_init_ok(T* own, ncclResult_t rc) {
  static std::atomic<bool> succeeded_once{false};
  if (rc == ncclSuccess) succeeded_once.store(true, std::memory_order_release);
  if (rc == ncclSuccess || succeeded_once.load(std::memory_order_acquire)) return true;
  try {
    log_warn("RS_NCCL_P2P_PLUGIN: the delegate's init failed (NCCL error " + std::to_string(int(rc)) +
             "): point-to-point traffic uses the built-in TCP net");
  } catch (...) {  // out of memory: fall back all the same
  }
  delegate::drop<T>();
  own->getDeviceMr = nullptr;
  own->irecvConsumed = nullptr;
  if constexpr (kHasVDevice<T>) own->makeVDevice = nullptr;
  if constexpr (kHasNetAttr<T>) own->setNetAttr = nullptr;
  return false;
}

void check_dev(int dev) {
  if (dev != 0) throw Error(ErrorKind::Config, "device " + std::to_string(dev) + " does not exist");
}

ncclResult_t net_init_common(ncclDebugLogger_t logger, int version) {
  set_logger(logger);
  return run_guarded("init", [&] {
    const NetInterface& ni = p2p::interface();
    log_info("net plugin v" + std::to_string(version) + " loaded by NCCL " +
             nccl_version_text(loading_nccl_version(logger)) + ": TCP on " + ni.name + " (" + ni.ip + "), " +
             std::to_string(p2p_sockets_from_env()) + " socket(s) per connection, " +
             std::to_string(p2p_threads_from_env()) + " progress thread(s) per comm");
  });
}

// v11/v12: with a delegate, NCCL keeps the delegate's context and passes it back to the
// delegate's listen / connect / finalize.
template <class T>
ncclResult_t net_init_ctx(T* own, int version, void** ctx, uint64_t comm_id, ncclNetCommConfig_t* config,
                          ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  if (ctx) *ctx = nullptr;
  return guarded("init", [&] {
    if (const T* d = delegate_for(own, logger)) {
      const ncclResult_t rc = d->init(ctx, comm_id, config, logger, prof);
      if (delegate_init_ok(own, rc)) return rc;
      if (ctx) *ctx = nullptr;
    }
    return net_init_common(logger, version);
  });
}
ncclResult_t net_init_v12(void** ctx, uint64_t id, ncclNetCommConfig_t* cfg, ncclDebugLogger_t logger,
                          ncclProfilerCallback_t prof) {
  return net_init_ctx(&ncclNetPlugin_v12, 12, ctx, id, cfg, logger, prof);
}
ncclResult_t net_init_v11(void** ctx, uint64_t id, ncclNetCommConfig_t* cfg, ncclDebugLogger_t logger,
                          ncclProfilerCallback_t prof) {
  return net_init_ctx(&ncclNetPlugin_v11, 11, ctx, id, cfg, logger, prof);
}
// v7-v10: no context; v10 also passes NCCL's profiler callback (`extra`) on to a delegate.
template <class T, class... Extra>
ncclResult_t net_init_logger(T* own, int version, ncclDebugLogger_t logger, Extra... extra) {
  return guarded("init", [&] {
    if (const T* d = delegate_for(own, logger)) {
      const ncclResult_t rc = d->init(logger, extra...);
      if (delegate_init_ok(own, rc)) return rc;
    }
    return net_init_common(logger, version);
  });
}
ncclResult_t net_init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  return net_init_logger(&ncclNetPlugin_v10, 10, logger, prof);
}
ncclResult_t net_init_v8(ncclDebugLogger_t logger) { return net_init_logger(&ncclNetPlugin_v8, 8, logger); }
ncclResult_t net_init_v7(ncclDebugLogger_t logger) { return net_init_logger(&ncclNetPlugin_v7, 7, logger); }

ncclResult_t net_devices(int* ndev) {
  *ndev = 0;
  return run_guarded("devices", [&] {
    p2p::init();
    *ndev = 1;
  });
}

template <class Props>
ncclResult_t net_get_properties(int dev, Props* props) {
  return get_properties(Side::Net, dev, props);
}

ncclResult_t net_listen_v12(void*, int dev, void* handle, void** listen_comm) {
  return run_guarded("listen", [&] {
    check_dev(dev);
    p2p::listen(handle, listen_comm);
  });
}
ncclResult_t net_listen_v8(int dev, void* handle, void** listen_comm) {
  return net_listen_v12(nullptr, dev, handle, listen_comm);
}

ncclResult_t net_connect_v12(void*, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return run_guarded("connect", [&] {
    *send_comm = nullptr;
    check_dev(dev);
    if (dev_comm) *dev_comm = nullptr;  // no device offload
    p2p::connect(handle, send_comm);
  });
}
ncclResult_t net_connect_v10(int dev, ncclNetCommConfig_t*, void* handle, void** send_comm,
                             ncclNetDeviceHandle_t** dev_comm) {
  return net_connect_v12(nullptr, dev, handle, send_comm, dev_comm);
}
ncclResult_t net_connect_v8(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return net_connect_v12(nullptr, dev, handle, send_comm, dev_comm);
}

ncclResult_t net_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev_comm) {
  return run_guarded("accept", [&] {
    *recv_comm = nullptr;
    if (dev_comm) *dev_comm = nullptr;
    p2p::accept(listen_comm, recv_comm);
  });
}

ncclResult_t net_isend_v12(void* send_comm, void* data, size_t size, int, void*, void*, void** request) {
  return run_guarded("isend", [&] {
    *request = nullptr;
    p2p::isend(send_comm, data, size, request);
  });
}
ncclResult_t net_isend_v8(void* send_comm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) return run_guarded("isend", [] { throw Error(ErrorKind::Config, "negative size"); });
  return net_isend_v12(send_comm, data, size_t(size), tag, mhandle, nullptr, request);
}

ncclResult_t net_irecv_v12(void* recv_comm, int n, void** data, size_t* sizes, int*, void**, void**, void** request) {
  return run_guarded("irecv", [&] {
    *request = nullptr;  // also clears NCCL_NET_OPTIONAL_RECV_COMPLETION: completion is always reported
    p2p::irecv(recv_comm, n, data, sizes, request);
  });
}
ncclResult_t net_irecv_v8(void* recv_comm, int n, void** data, int* sizes, int* /*tags*/, void** /*mhandles*/,
                          void** request) {
  return run_guarded("irecv", [&] {
    *request = nullptr;
    if (n != 1) throw Error(ErrorKind::Config, "irecv of " + std::to_string(n) + " buffers: maxRecvs is 1");
    if (sizes[0] < 0) throw Error(ErrorKind::Config, "negative size");
    size_t size = size_t(sizes[0]);
    p2p::irecv(recv_comm, n, data, &size, request);
  });
}

// Host memory needs no flush (NCCL asks only with GPUDirect, which this plugin never claims).
ncclResult_t net_iflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;
  return ncclSuccess;
}

ncclResult_t net_test(void* request, int* done, int* size) {
  return run_guarded("test", [&] { p2p::test(request, done, size); });
}

ncclResult_t net_close(void* comm) {
  return run_guarded("close", [&] { p2p::close_comm(comm); });
}

ncclResult_t net_close_listen(void* listen_comm) {
  return run_guarded("closeListen", [&] { p2p::close_listen(listen_comm); });
}

// Every comm's progress thread is joined when the comm is closed: nothing is left to stop.
// NCCL 2.28.3 also calls it after a failed init, with whatever init left in the context.
ncclResult_t net_finalize(void*) { return ncclSuccess; }

// ---- the tables, member by member --------------------------------------------------------------
//
// As in exports_collnet.cc: each table is value-initialized (every member NULL) and then set member
// by member, by name, in a constexpr builder (C++17 has no designated initializers; the plugin keeps
// the core's -std=c++17), and each exported table is copied from a constexpr value, so it stays
// constant-initialized. Every member but name and init forwards to a delegate table of the same
// version when one is adopted (Fwd). nccl_abi.h's static_asserts pin the offsets;
// tests/nccl_plugin/test_nccl_plugin_tables.py checks what every exported table holds, member by member.

template <class T>
constexpr void set_net_common(T& t) {
  t.name = kPluginName;
  t.devices = Fwd<&T::devices, net_devices>::call;
  t.accept = Fwd<&T::accept, net_accept>::call;
  t.regMrDmaBuf = Fwd<&T::regMrDmaBuf, reg_mr_dmabuf>::call;
  t.deregMr = Fwd<&T::deregMr, dereg_mr>::call;
  t.iflush = Fwd<&T::iflush, net_iflush>::call;
  t.test = Fwd<&T::test, net_test>::call;
  t.closeSend = Fwd<&T::closeSend, net_close>::call;
  t.closeRecv = Fwd<&T::closeRecv, net_close>::call;
  t.closeListen = Fwd<&T::closeListen, net_close_listen>::call;
  // The optional members stay NULL for the built-in net; adopt_optional() sets the delegate's.
  t.getDeviceMr = nullptr;
  t.irecvConsumed = nullptr;
}

// v8 and on: size_t regMr (v7's takes an int size).
template <class T, class Props>
constexpr T net_table_v8_on() {
  T t{};
  set_net_common(t);
  t.getProperties = Fwd<&T::getProperties, net_get_properties<Props>>::call;
  t.regMr = Fwd<&T::regMr, reg_mr>::call;
  return t;
}

// v11 and v12: a context (init makes it, listen / connect take it, finalize frees it).
template <class T, class Props>
constexpr T net_table_ctx() {
  auto t = net_table_v8_on<T, Props>();
  t.listen = Fwd<&T::listen, net_listen_v12>::call;
  t.connect = Fwd<&T::connect, net_connect_v12>::call;
  t.isend = Fwd<&T::isend, net_isend_v12>::call;
  t.irecv = Fwd<&T::irecv, net_irecv_v12>::call;
  t.makeVDevice = nullptr;  // optional: the delegate's, if any
  t.finalize = Fwd<&T::finalize, net_finalize>::call;
  t.setNetAttr = nullptr;  // optional: the delegate's, if any
  return t;
}

constexpr ncclNet_v12_t net_table_v12() {
  auto t = net_table_ctx<ncclNet_v12_t, ncclNetProperties_v12_t>();
  t.init = net_init_v12;
  return t;
}

constexpr ncclNet_v11_t net_table_v11() {
  auto t = net_table_ctx<ncclNet_v11_t, ncclNetProperties_v11_t>();
  t.init = net_init_v11;
  return t;
}

// NCCL 2.26-2.27 (their newest; no context, no finalize).
constexpr ncclNet_v10_t net_table_v10() {
  auto t = net_table_v8_on<ncclNet_v10_t, ncclNetProperties_v10_t>();
  t.init = net_init_v10;
  t.listen = Fwd<&ncclNet_v10_t::listen, net_listen_v8>::call;
  t.connect = Fwd<&ncclNet_v10_t::connect, net_connect_v10>::call;
  t.isend = Fwd<&ncclNet_v10_t::isend, net_isend_v12>::call;
  t.irecv = Fwd<&ncclNet_v10_t::irecv, net_irecv_v12>::call;
  t.makeVDevice = nullptr;  // optional: the delegate's, if any
  return t;
}

constexpr ncclNet_v8_t net_table_v8() {
  auto t = net_table_v8_on<ncclNet_v8_t, ncclNetProperties_v8_t>();
  t.init = net_init_v8;
  t.listen = Fwd<&ncclNet_v8_t::listen, net_listen_v8>::call;
  t.connect = Fwd<&ncclNet_v8_t::connect, net_connect_v8>::call;
  t.isend = Fwd<&ncclNet_v8_t::isend, net_isend_v8>::call;
  t.irecv = Fwd<&ncclNet_v8_t::irecv, net_irecv_v8>::call;
  return t;
}

// NCCL 2.19 (the newest it knows): regMr takes an int size.
constexpr ncclNet_v7_t net_table_v7() {
  ncclNet_v7_t t{};
  set_net_common(t);
  t.init = net_init_v7;
  t.getProperties = Fwd<&ncclNet_v7_t::getProperties, net_get_properties<ncclNetProperties_v7_t>>::call;
  t.listen = Fwd<&ncclNet_v7_t::listen, net_listen_v8>::call;
  t.connect = Fwd<&ncclNet_v7_t::connect, net_connect_v8>::call;
  t.regMr = Fwd<&ncclNet_v7_t::regMr, reg_mr_v7>::call;
  t.isend = Fwd<&ncclNet_v7_t::isend, net_isend_v8>::call;
  t.irecv = Fwd<&ncclNet_v7_t::irecv, net_irecv_v8>::call;
  return t;
}

constexpr ncclNet_v12_t kNetV12 = net_table_v12();
constexpr ncclNet_v11_t kNetV11 = net_table_v11();
constexpr ncclNet_v10_t kNetV10 = net_table_v10();
constexpr ncclNet_v8_t kNetV8 = net_table_v8();
constexpr ncclNet_v7_t kNetV7 = net_table_v7();

}  // namespace
}  // namespace rs::nccl

// Not const: adopt_optional() / delegate_init_ok() set the optional members at init.
extern "C" {
RS_EXPORT ncclNet_v12_t ncclNetPlugin_v12 = rs::nccl::kNetV12;
RS_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = rs::nccl::kNetV11;
RS_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = rs::nccl::kNetV10;
RS_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = rs::nccl::kNetV8;
RS_EXPORT ncclNet_v7_t ncclNetPlugin_v7 = rs::nccl::kNetV7;
}  // extern "C"
