// The CollNet tables NCCL looks up: ncclCollNetPlugin_v{7,8,9,10,11,12}. v12 is the
// implementation; the others are thin adapters. Every entry point goes through (run_)guarded():
// no exception reaches NCCL.
//
// One table per CollNet version any release searches first: each NCCL from 2.19 to 2.30 then
// finds its own newest and holds our table as it is (no NCCL adapter in between), so its tuner
// sees NULL iallgather / ireducescatter and never picks CollNet for all-gather / reduce-scatter.
// (With v8 alone, 2.24-2.27 wrapped it in adapters that call those members unconditionally.)
//
// init fails (and leaves no context) whenever devices() would answer 0: every NCCL release then
// disables CollNet for the process (2.19-2.27) or the communicator (2.28+) and never calls
// finalize for it. An init that succeeded with no device made NCCL 2.28.3 call finalize through
// a NULL CollNet table at communicator destroy (docs/nccl-plugin.md, "Versions").
#include <atomic>
#include <chrono>
#include <string>

#include "nccl_plugin/collnet.h"
#include "nccl_plugin/exports_common.h"
#include "nccl_plugin/nccl_version.h"
#include "nccl_plugin/p2p_net.h"
#include "nccl_plugin/plugin_log.h"

extern "C" {
extern ncclCollNet_v12_t ncclCollNetPlugin_v12;
}

namespace rs::nccl {
namespace {

// ---- all-gather / reduce-scatter: NULL where NCCL uses the table as it is, else a refusal ------

// All-gather / reduce-scatter offload needs a reducer-side gather; not offered.
ncclResult_t coll_unsupported(const char* what) noexcept {
  static LogLimiter limiter(5, std::chrono::seconds(10));
  limiter.warn(std::string(what) + " is not supported by the reduction-server CollNet (all-reduce only)");
  return ncclInternalError;
}
ncclResult_t coll_iallgather(void*, void*, int, ncclNetSGE_t*, size_t, size_t, size_t, void*, void** request) {
  *request = nullptr;
  return coll_unsupported("iallgather");
}
ncclResult_t coll_ireducescatter(void*, int, ncclNetSGE_t*, void*, size_t, size_t, size_t, ncclDataType_t, ncclRedOp_t,
                                 void*, void** request) {
  *request = nullptr;
  return coll_unsupported("ireducescatter");
}

std::string gather_mode_text(int table, int code, bool direct) {
  const std::string by = "CollNet v" + std::to_string(table) + " loaded by NCCL " + nccl_version_text(code);
  if (table == 7) return by + ": all-reduce only (v7 has no all-gather / reduce-scatter members)";
  if (direct)
    return by +
           ", which uses the table as it is: iallgather/ireducescatter are NULL, so NCCL never picks CollNet "
           "for all-gather / reduce-scatter";
  return by +
         (code && newest_collnet_version(code) ? ", through its adapter (which calls iallgather/ireducescatter "
                                                 "unconditionally)"
                                               : " (a version this plugin does not know: assuming an adapter)") +
         ": iallgather/ireducescatter refuse with ncclInternalError if NCCL ever picks CollNet for them";
}

// Chooses the members for the NCCL that is loading this table (only v12 has a choice: the older
// tables are only ever held as they are, and carry NULL statically); logs the choice once per load.
void configure_gather_members(int table, ncclDebugLogger_t logger) {
  const int code = loading_nccl_version(logger);
  const bool direct = collnet_table_used_directly(table, code);
  if (table == kNewestCollNetExported) {
    // NCCL reads these members only after a successful init; the stores are atomic anyway
    // (another communicator's init may run on another thread).
    auto& t = ncclCollNetPlugin_v12;
    __atomic_store_n(&t.iallgather, direct ? nullptr : coll_iallgather, __ATOMIC_RELEASE);
    __atomic_store_n(&t.ireducescatter, direct ? nullptr : coll_ireducescatter, __ATOMIC_RELEASE);
  }
  static std::atomic<int> logged{0};
  const int key = table * 100000 + code % 100000;
  if (logged.exchange(key) != key) log_info(gather_mode_text(table, code, direct));
}

// ---- init / devices / finalize ----------------------------------------------------------------

ncclResult_t coll_init_common(ncclDebugLogger_t logger, int version, void** ctx, uint64_t comm_id) {
  if (ctx) *ctx = nullptr;
  set_logger(logger);
  return guarded("CollNet init", [&] {
    collnet::init();                                   // reads the reducer pool; logs it, or why CollNet is off
    if (!collnet::devices()) return ncclInvalidUsage;  // no device: fail, so NCCL disables CollNet
    p2p::init();                                       // the NIC CollNet reports (throws if none)
    configure_gather_members(version, logger);
    if (ctx) *ctx = collnet::make_context(comm_id);
    return ncclSuccess;
  });
}
ncclResult_t coll_init_v12(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) {
  return coll_init_common(logger, 12, ctx, comm_id);
}
ncclResult_t coll_init_v11(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) {
  return coll_init_common(logger, 11, ctx, comm_id);
}
ncclResult_t coll_init_v10(ncclDebugLogger_t logger) { return coll_init_common(logger, 10, nullptr, 0); }
ncclResult_t coll_init_v9(ncclDebugLogger_t logger) { return coll_init_common(logger, 9, nullptr, 0); }
ncclResult_t coll_init_v8(ncclDebugLogger_t logger) { return coll_init_common(logger, 8, nullptr, 0); }
ncclResult_t coll_init_v7(ncclDebugLogger_t logger) { return coll_init_common(logger, 7, nullptr, 0); }

// The same answer init acted on: 1 with a reducer pool (and a usable NIC), else 0.
ncclResult_t coll_devices(int* ndev) {
  *ndev = 0;
  return run_guarded("CollNet devices", [&] {
    if (!collnet::devices()) return;
    p2p::init();
    *ndev = 1;
  });
}

// NULL (a failed init, or NCCL 2.28.7+ finalizing a communicator that never got a context) is a no-op.
ncclResult_t coll_finalize(void* ctx) {
  return run_guarded("CollNet finalize", [&] { collnet::free_context(ctx); });
}

// ---- the rest ---------------------------------------------------------------------------------

template <class Props>
ncclResult_t coll_get_properties(int dev, Props* props) {
  return get_properties(Side::CollNet, dev, props);
}

ncclResult_t coll_listen_v12(void* ctx, int dev, void* handle, void** listen_comm) {
  return run_guarded("CollNet listen", [&] {
    *listen_comm = nullptr;
    if (dev < 0 || dev >= collnet::devices())
      throw Error(ErrorKind::Config, "device " + std::to_string(dev) + " does not exist");
    collnet::listen(ctx, handle, listen_comm);
  });
}
ncclResult_t coll_listen_v8(int dev, void* handle, void** listen_comm) {
  return coll_listen_v12(nullptr, dev, handle, listen_comm);
}

ncclResult_t coll_connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  return run_guarded("CollNet connect", [&] { collnet::connect(handles, nranks, rank, listen_comm, coll_comm); });
}

ncclResult_t coll_reduce_support(ncclDataType_t dtype, ncclRedOp_t op, int* supported) {
  *supported = collnet::reduce_support(int(dtype), int(op));
  return ncclSuccess;
}

ncclResult_t coll_iallreduce_v12(void* coll_comm, void* send, void* recv, size_t count, ncclDataType_t dtype,
                                 ncclRedOp_t op, void* send_mh, void* recv_mh, void** request) {
  return run_guarded("CollNet iallreduce", [&] {
    *request = nullptr;
    collnet::iallreduce(coll_comm, send, recv, count, int(dtype), int(op), send_mh, recv_mh, request);
  });
}
ncclResult_t coll_iallreduce_v8(void* coll_comm, void* send, void* recv, int count, ncclDataType_t dtype,
                                ncclRedOp_t op, void* send_mh, void* recv_mh, void** request) {
  if (count < 0) return run_guarded("CollNet iallreduce", [] { throw Error(ErrorKind::Config, "negative count"); });
  return coll_iallreduce_v12(coll_comm, send, recv, size_t(count), dtype, op, send_mh, recv_mh, request);
}

ncclResult_t coll_iflush(void*, void*, int, void*, void** request) {
  *request = nullptr;  // host memory: nothing to flush
  return ncclSuccess;
}

ncclResult_t coll_test(void* request, int* done, int* size) {
  return run_guarded("CollNet test", [&] {
    *done = 0;
    collnet::test(request, done, size);
  });
}

ncclResult_t coll_close(void* coll_comm) {
  return run_guarded("CollNet closeColl", [&] { collnet::close_coll(coll_comm); });
}

ncclResult_t coll_close_listen(void* listen_comm) {
  return run_guarded("CollNet closeListen", [&] { collnet::close_listen(listen_comm); });
}

// ---- the tables, member by member --------------------------------------------------------------
//
// Each table is built by a constexpr function that value-initializes it (every member NULL) and then
// sets each member by name, so a table can never silently shift a function into its neighbour's
// slot (NCCL's example plugin uses C++20 designated initializers for the same reason). C++17 has no
// designated initializers (gcc takes them only as an extension, with -pedantic warnings) and the
// plugin is built with the core's -std=c++17 flags, so the tables are not a C++20 island; a
// constexpr builder keeps them constant-initialized (in .data before any code runs) all the same:
// each exported table is copied from a constexpr value, which must be a constant expression.
// nccl_abi.h's static_asserts pin the members' offsets; tests/nccl_plugin/test_nccl_plugin_tables.py checks,
// member by member, what every exported table holds.

// The members every CollNet version has, in every version's types.
template <class T>
constexpr void set_coll_common(T& t) {
  t.name = kPluginName;
  t.devices = coll_devices;
  t.connect = coll_connect;
  t.reduceSupport = coll_reduce_support;
  t.regMrDmaBuf = reg_mr_dmabuf;
  t.deregMr = dereg_mr;
  t.iflush = coll_iflush;
  t.test = coll_test;
  t.closeColl = coll_close;
  t.closeListen = coll_close_listen;
}

// v8 to v12: size_t regMr; all-gather / reduce-scatter NULL (not offered: NCCL's tuner then never
// picks CollNet for them; only v12's are set by init, configure_gather_members above).
template <class T, class Props>
constexpr T coll_table_v8_on() {
  T t{};
  set_coll_common(t);
  t.getProperties = coll_get_properties<Props>;
  t.regMr = reg_mr;
  t.iallgather = nullptr;
  t.ireducescatter = nullptr;
  return t;
}

constexpr ncclCollNet_v12_t coll_table_v12() {
  auto t = coll_table_v8_on<ncclCollNet_v12_t, ncclNetProperties_v12_t>();
  t.init = coll_init_v12;
  t.listen = coll_listen_v12;
  t.iallreduce = coll_iallreduce_v12;
  // Until init chooses for the NCCL that loads the table: what an unknown NCCL (one that may go
  // through an adapter calling them unconditionally) gets.
  t.iallgather = coll_iallgather;
  t.ireducescatter = coll_ireducescatter;
  t.makeVDevice = nullptr;  // no virtual devices
  t.finalize = coll_finalize;
  return t;
}

constexpr ncclCollNet_v11_t coll_table_v11() {
  auto t = coll_table_v8_on<ncclCollNet_v11_t, ncclNetProperties_v11_t>();
  t.init = coll_init_v11;
  t.listen = coll_listen_v12;
  t.iallreduce = coll_iallreduce_v12;
  t.makeVDevice = nullptr;
  t.finalize = coll_finalize;
  return t;
}

// v10 and v9 share one layout (ncclCollNet_v9_t is ncclCollNet_v10_t); only init differs.
constexpr ncclCollNet_v10_t coll_table_v10(ncclResult_t (*init)(ncclDebugLogger_t)) {
  auto t = coll_table_v8_on<ncclCollNet_v10_t, ncclNetProperties_v10_t>();
  t.init = init;
  t.listen = coll_listen_v8;
  t.iallreduce = coll_iallreduce_v12;
  t.makeVDevice = nullptr;
  return t;
}

constexpr ncclCollNet_v8_t coll_table_v8() {
  auto t = coll_table_v8_on<ncclCollNet_v8_t, ncclNetProperties_v8_t>();
  t.init = coll_init_v8;
  t.listen = coll_listen_v8;
  t.iallreduce = coll_iallreduce_v8;
  return t;
}

// v7 has no all-gather / reduce-scatter members at all; regMr takes an int size.
constexpr ncclCollNet_v7_t coll_table_v7() {
  ncclCollNet_v7_t t{};
  set_coll_common(t);
  t.init = coll_init_v7;
  t.getProperties = coll_get_properties<ncclNetProperties_v7_t>;
  t.listen = coll_listen_v8;
  t.regMr = reg_mr_v7;
  t.iallreduce = coll_iallreduce_v8;
  return t;
}

constexpr ncclCollNet_v12_t kCollV12 = coll_table_v12();
constexpr ncclCollNet_v11_t kCollV11 = coll_table_v11();
constexpr ncclCollNet_v10_t kCollV10 = coll_table_v10(coll_init_v10);
constexpr ncclCollNet_v9_t kCollV9 = coll_table_v10(coll_init_v9);
constexpr ncclCollNet_v8_t kCollV8 = coll_table_v8();
constexpr ncclCollNet_v7_t kCollV7 = coll_table_v7();

}  // namespace
}  // namespace rs::nccl

extern "C" {

// Not const: init sets v12's iallgather / ireducescatter for the NCCL that loads it.
RS_EXPORT ncclCollNet_v12_t ncclCollNetPlugin_v12 = rs::nccl::kCollV12;

// v11 down to v8: only ever held as they are (NCCL 2.28-2.29, 2.26-2.27, 2.24-2.25, 2.20-2.23),
// so iallgather / ireducescatter are NULL: NCCL's tuner never picks CollNet for them.
RS_EXPORT ncclCollNet_v11_t ncclCollNetPlugin_v11 = rs::nccl::kCollV11;

// NCCL 2.26-2.27 log the CollNet v10 table's name through their ncclNetPlugin_v10 pointer (NULL
// unless the net v10 table is exported too: exports_net.cc).
RS_EXPORT ncclCollNet_v10_t ncclCollNetPlugin_v10 = rs::nccl::kCollV10;
RS_EXPORT ncclCollNet_v9_t ncclCollNetPlugin_v9 = rs::nccl::kCollV9;
RS_EXPORT ncclCollNet_v8_t ncclCollNetPlugin_v8 = rs::nccl::kCollV8;

// NCCL 2.19 (the newest it knows).
RS_EXPORT ncclCollNet_v7_t ncclCollNetPlugin_v7 = rs::nccl::kCollV7;

}  // extern "C"
