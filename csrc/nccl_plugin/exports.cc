// The exported symbols NCCL looks up: ncclNetPlugin_v{8,11,12} and ncclCollNetPlugin_v{8,11,12}.
// v12 is the implementation; v11 and v8 are thin adapters (properties layout, int sizes, no
// context). Every entry point goes through (run_)guarded(): no exception reaches NCCL.
#include <cstring>
#include <string>

#include "nccl_plugin/collnet.h"
#include "nccl_plugin/mem_region.h"
#include "nccl_plugin/nccl_abi.h"
#include "nccl_plugin/p2p_net.h"
#include "nccl_plugin/plugin_log.h"

#define RS_EXPORT __attribute__((visibility("default")))

namespace rs::nccl {
namespace {

constexpr const char* kName = "reduction-server";

void check_dev(int dev, int ndev) {
  if (dev < 0 || dev >= ndev) throw Error(ErrorKind::Config, "device " + std::to_string(dev) + " does not exist");
}

// The one NIC: the same device for point-to-point and CollNet (NCCL then sees one NIC that
// can do both). The interface is chosen once per load, so its strings live as long as the library.
void fill_v12(ncclNetProperties_v12_t* p, size_t max_coll_bytes) {
  const NetInterface& ni = p2p::interface();
  const std::string& name = ni.name;
  const std::string& pci = ni.pci_path;
  std::memset(p, 0, sizeof *p);
  p->name = const_cast<char*>(name.c_str());
  p->pciPath = pci.empty() ? nullptr : const_cast<char*>(pci.c_str());
  p->guid = 0;
  p->ptrSupport = NCCL_PTR_HOST;
  p->regIsGlobal = 0;
  p->forceFlush = 0;
  p->speed = ni.speed_mbps;
  p->port = 0;
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = 0;
  p->maxP2pBytes = p2p::kMaxMessageBytes;
  p->maxCollBytes = max_coll_bytes;
  p->maxMultiRequestSize = 1;
  p->railId = NCCL_NET_ID_UNDEF;
  p->planeId = NCCL_NET_ID_UNDEF;
}

void to_v11(const ncclNetProperties_v12_t& a, ncclNetProperties_v11_t* p) {
  std::memset(p, 0, sizeof *p);
  p->name = a.name;
  p->pciPath = a.pciPath;
  p->guid = a.guid;
  p->ptrSupport = a.ptrSupport;
  p->regIsGlobal = a.regIsGlobal;
  p->forceFlush = a.forceFlush;
  p->speed = a.speed;
  p->port = a.port;
  p->latency = a.latency;
  p->maxComms = a.maxComms;
  p->maxRecvs = a.maxRecvs;
  p->netDeviceType = a.netDeviceType;
  p->netDeviceVersion = a.netDeviceVersion;
  p->vProps.ndevs = a.vProps.ndevs;
  for (int i = 0; i < a.vProps.ndevs && i < 4; ++i) p->vProps.devs[i] = a.vProps.devs[i];
  p->maxP2pBytes = a.maxP2pBytes;
  p->maxCollBytes = a.maxCollBytes;
  p->maxMultiRequestSize = a.maxMultiRequestSize;
}

void to_v8(const ncclNetProperties_v12_t& a, ncclNetProperties_v8_t* p) {
  std::memset(p, 0, sizeof *p);
  p->name = a.name;
  p->pciPath = a.pciPath;
  p->guid = a.guid;
  p->ptrSupport = a.ptrSupport;
  p->regIsGlobal = a.regIsGlobal;
  p->speed = a.speed;
  p->port = a.port;
  p->latency = a.latency;
  p->maxComms = a.maxComms;
  p->maxRecvs = a.maxRecvs;
  p->netDeviceType = a.netDeviceType;
  p->netDeviceVersion = a.netDeviceVersion;
}

// ---- point-to-point net (v12) ------------------------------------------------------------------

int net_devices_checked() {
  p2p::init();
  return 1;
}

ncclResult_t net_init_common(ncclDebugLogger_t logger, int version) {
  set_logger(logger);
  return run_guarded("init", [&] {
    const NetInterface& ni = p2p::interface();
    log_info("net plugin v" + std::to_string(version) + " loaded: TCP on " + ni.name + " (" + ni.ip + "), " +
             std::to_string(p2p_sockets_from_env()) + " socket(s) per connection");
  });
}

ncclResult_t net_init_v12(void** ctx, uint64_t, ncclNetCommConfig_t*, ncclDebugLogger_t logger, ncclProfilerCallback_t) {
  if (ctx) *ctx = nullptr;
  return net_init_common(logger, 12);
}
ncclResult_t net_init_v11(void** ctx, uint64_t, ncclNetCommConfig_t*, ncclDebugLogger_t logger, ncclProfilerCallback_t) {
  if (ctx) *ctx = nullptr;
  return net_init_common(logger, 11);
}
ncclResult_t net_init_v8(ncclDebugLogger_t logger) { return net_init_common(logger, 8); }

ncclResult_t net_devices(int* ndev) {
  *ndev = 0;
  return run_guarded("devices", [&] {
    *ndev = net_devices_checked();
  });
}

ncclResult_t net_get_properties_v12(int dev, ncclNetProperties_v12_t* props) {
  return run_guarded("getProperties", [&] {
    check_dev(dev, 1);
    fill_v12(props, collnet::kMaxCollBytes);
  });
}
ncclResult_t net_get_properties_v11(int dev, ncclNetProperties_v11_t* props) {
  ncclNetProperties_v12_t p;
  ncclResult_t rc = net_get_properties_v12(dev, &p);
  if (rc == ncclSuccess) to_v11(p, props);
  return rc;
}
ncclResult_t net_get_properties_v8(int dev, ncclNetProperties_v8_t* props) {
  ncclNetProperties_v12_t p;
  ncclResult_t rc = net_get_properties_v12(dev, &p);
  if (rc == ncclSuccess) to_v8(p, props);
  return rc;
}

ncclResult_t net_listen_v12(void*, int dev, void* handle, void** listen_comm) {
  return run_guarded("listen", [&] {
    check_dev(dev, 1);
    p2p::listen(handle, listen_comm);
  });
}
ncclResult_t net_listen_v8(int dev, void* handle, void** listen_comm) { return net_listen_v12(nullptr, dev, handle, listen_comm); }

ncclResult_t net_connect_v12(void*, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return run_guarded("connect", [&] {
    *send_comm = nullptr;
    check_dev(dev, 1);
    if (dev_comm) *dev_comm = nullptr;  // no device offload
    p2p::connect(handle, send_comm);
  });
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

ncclResult_t reg_mr(void*, void* data, size_t size, int type, void** mhandle) {
  return run_guarded("regMr", [&] {
    *mhandle = nullptr;
    *mhandle = register_region(data, size, type);
  });
}

ncclResult_t reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  *mhandle = nullptr;
  return run_guarded("regMrDmaBuf", [] {
    throw Error(ErrorKind::Config, "DMA-BUF memory is not supported: this plugin moves host memory only");
  });
}

ncclResult_t dereg_mr(void*, void* mhandle) {
  return run_guarded("deregMr", [&] {
    deregister_region(mhandle);
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
  return run_guarded("test", [&] {
    p2p::test(request, done, size);
  });
}

ncclResult_t net_close(void* comm) {
  return run_guarded("close", [&] {
    p2p::close_comm(comm);
  });
}

ncclResult_t net_close_listen(void* listen_comm) {
  return run_guarded("closeListen", [&] {
    p2p::close_listen(listen_comm);
  });
}

// Every comm's progress thread is joined when the comm is closed: nothing is left to stop.
ncclResult_t net_finalize(void*) { return ncclSuccess; }

// ---- CollNet (v12) -------------------------------------------------------------------------------

ncclResult_t coll_init_common(ncclDebugLogger_t logger, int version, void** ctx, uint64_t comm_id) {
  set_logger(logger);
  return run_guarded("CollNet init", [&] {
    if (ctx) *ctx = nullptr;
    collnet::init();
    if (ctx) *ctx = collnet::make_context(comm_id);
    log_info("CollNet plugin v" + std::to_string(version) + " loaded");
  });
}
ncclResult_t coll_init_v12(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) { return coll_init_common(logger, 12, ctx, comm_id); }
ncclResult_t coll_init_v11(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) { return coll_init_common(logger, 11, ctx, comm_id); }
ncclResult_t coll_init_v8(ncclDebugLogger_t logger) { return coll_init_common(logger, 8, nullptr, 0); }

ncclResult_t coll_devices(int* ndev) {
  *ndev = 0;
  return run_guarded("CollNet devices", [&] {
    // Without the point-to-point net NCCL ignores CollNet anyway; no interface, no device.
    *ndev = collnet::devices() ? net_devices_checked() : 0;
  });
}

ncclResult_t coll_get_properties_v12(int dev, ncclNetProperties_v12_t* props) {
  return run_guarded("CollNet getProperties", [&] {
    check_dev(dev, collnet::devices());
    fill_v12(props, collnet::kMaxCollBytes);
  });
}
ncclResult_t coll_get_properties_v11(int dev, ncclNetProperties_v11_t* props) {
  ncclNetProperties_v12_t p;
  ncclResult_t rc = coll_get_properties_v12(dev, &p);
  if (rc == ncclSuccess) to_v11(p, props);
  return rc;
}
ncclResult_t coll_get_properties_v8(int dev, ncclNetProperties_v8_t* props) {
  ncclNetProperties_v12_t p;
  ncclResult_t rc = coll_get_properties_v12(dev, &p);
  if (rc == ncclSuccess) to_v8(p, props);
  return rc;
}

ncclResult_t coll_listen_v12(void* ctx, int dev, void* handle, void** listen_comm) {
  return run_guarded("CollNet listen", [&] {
    *listen_comm = nullptr;
    check_dev(dev, collnet::devices());
    collnet::listen(ctx, handle, listen_comm);
  });
}
ncclResult_t coll_listen_v8(int dev, void* handle, void** listen_comm) { return coll_listen_v12(nullptr, dev, handle, listen_comm); }

ncclResult_t coll_connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  return run_guarded("CollNet connect", [&] {
    collnet::connect(handles, nranks, rank, listen_comm, coll_comm);
  });
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

// All-gather / reduce-scatter offload needs CollNetDirect (NVSwitch) and a reducer-side
// gather; not offered. v12 leaves the members NULL (NCCL's tuner then never picks them);
// NCCL's v8-v11 adapters call them unconditionally, so those tables get this refusal.
ncclResult_t coll_unsupported(const char* what) {
  log_warn(std::string(what) + " is not supported by the reduction-server CollNet (all-reduce only)");
  return ncclInternalError;
}
ncclResult_t coll_iallgather_v11(void*, void*, int, ncclNetSGE_t*, size_t, size_t, size_t, void*, void** request) {
  *request = nullptr;
  return coll_unsupported("iallgather");
}
ncclResult_t coll_ireducescatter_v11(void*, int, ncclNetSGE_t*, void*, size_t, size_t, size_t, ncclDataType_t,
                                     ncclRedOp_t, void*, void** request) {
  *request = nullptr;
  return coll_unsupported("ireducescatter");
}
ncclResult_t coll_iallgather_v8(void*, void*, int, ncclNetSGE_v8_t*, size_t, size_t, size_t, void*, void** request) {
  *request = nullptr;
  return coll_unsupported("iallgather");
}
ncclResult_t coll_ireducescatter_v8(void*, int, ncclNetSGE_v8_t*, void*, size_t, size_t, size_t, ncclDataType_t,
                                    ncclRedOp_t, void*, void** request) {
  *request = nullptr;
  return coll_unsupported("ireducescatter");
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
  return run_guarded("CollNet closeColl", [&] {
    collnet::close_coll(coll_comm);
  });
}

ncclResult_t coll_close_listen(void* listen_comm) {
  return run_guarded("CollNet closeListen", [&] {
    collnet::close_listen(listen_comm);
  });
}

ncclResult_t coll_finalize(void* ctx) {
  return run_guarded("CollNet finalize", [&] {
    collnet::free_context(ctx);
  });
}

}  // namespace
}  // namespace rs::nccl

using namespace rs::nccl;

extern "C" {

RS_EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
    kName, net_init_v12, net_devices, net_get_properties_v12, net_listen_v12, net_connect_v12, net_accept, reg_mr,
    reg_mr_dmabuf, dereg_mr, net_isend_v12, net_irecv_v12, net_iflush, net_test, net_close, net_close,
    net_close_listen, nullptr /* getDeviceMr */, nullptr /* irecvConsumed */, nullptr /* makeVDevice */,
    net_finalize, nullptr /* setNetAttr */};

RS_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    kName, net_init_v11, net_devices, net_get_properties_v11, net_listen_v12, net_connect_v12, net_accept, reg_mr,
    reg_mr_dmabuf, dereg_mr, net_isend_v12, net_irecv_v12, net_iflush, net_test, net_close, net_close,
    net_close_listen, nullptr, nullptr, nullptr, net_finalize, nullptr};

RS_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    kName, net_init_v8, net_devices, net_get_properties_v8, net_listen_v8, net_connect_v8, net_accept, reg_mr,
    reg_mr_dmabuf, dereg_mr, net_isend_v8, net_irecv_v8, net_iflush, net_test, net_close, net_close,
    net_close_listen, nullptr, nullptr};

RS_EXPORT ncclCollNet_v12_t ncclCollNetPlugin_v12 = {
    kName, coll_init_v12, coll_devices, coll_get_properties_v12, coll_listen_v12, coll_connect, coll_reduce_support,
    reg_mr, reg_mr_dmabuf, dereg_mr, coll_iallreduce_v12, nullptr /* iallgather */, nullptr /* ireducescatter */,
    coll_iflush, coll_test, coll_close, coll_close_listen, nullptr /* makeVDevice */, coll_finalize};

RS_EXPORT ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    kName, coll_init_v11, coll_devices, coll_get_properties_v11, coll_listen_v12, coll_connect, coll_reduce_support,
    reg_mr, reg_mr_dmabuf, dereg_mr, coll_iallreduce_v12, coll_iallgather_v11, coll_ireducescatter_v11, coll_iflush,
    coll_test, coll_close, coll_close_listen, nullptr, coll_finalize};

RS_EXPORT ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    kName, coll_init_v8, coll_devices, coll_get_properties_v8, coll_listen_v8, coll_connect, coll_reduce_support,
    reg_mr, reg_mr_dmabuf, dereg_mr, coll_iallreduce_v8, coll_iallgather_v8, coll_ireducescatter_v8, coll_iflush,
    coll_test, coll_close, coll_close_listen};

}  // extern "C"
