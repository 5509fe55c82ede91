// The point-to-point net tables NCCL looks up: ncclNetPlugin_v{7,8,11,12}. v12 is the
// implementation; v11, v8 and v7 are thin adapters (properties layout, int sizes, no context).
// Every entry point goes through (run_)guarded(): no exception reaches NCCL.
#include <string>

#include "nccl_plugin/exports_common.h"
#include "nccl_plugin/nccl_version.h"
#include "nccl_plugin/p2p_net.h"
#include "nccl_plugin/plugin_log.h"

namespace rs::nccl {
namespace {

void check_dev(int dev) {
  if (dev != 0) throw Error(ErrorKind::Config, "device " + std::to_string(dev) + " does not exist");
}

ncclResult_t net_init_common(ncclDebugLogger_t logger, int version) {
  set_logger(logger);
  return run_guarded("init", [&] {
    const NetInterface& ni = p2p::interface();
    log_info("net plugin v" + std::to_string(version) + " loaded by NCCL " +
             nccl_version_text(loading_nccl_version(logger)) + ": TCP on " + ni.name + " (" + ni.ip + "), " +
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
ncclResult_t net_init_v7(ncclDebugLogger_t logger) { return net_init_common(logger, 7); }

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
ncclResult_t net_listen_v8(int dev, void* handle, void** listen_comm) { return net_listen_v12(nullptr, dev, handle, listen_comm); }

ncclResult_t net_connect_v12(void*, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return run_guarded("connect", [&] {
    *send_comm = nullptr;
    check_dev(dev);
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

}  // namespace
}  // namespace rs::nccl

using namespace rs::nccl;

extern "C" {

RS_EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
    kPluginName, net_init_v12, net_devices, net_get_properties<ncclNetProperties_v12_t>, net_listen_v12,
    net_connect_v12, net_accept, reg_mr, reg_mr_dmabuf, dereg_mr, net_isend_v12, net_irecv_v12, net_iflush, net_test,
    net_close, net_close, net_close_listen, nullptr /* getDeviceMr */, nullptr /* irecvConsumed */,
    nullptr /* makeVDevice */, net_finalize, nullptr /* setNetAttr */};

RS_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    kPluginName, net_init_v11, net_devices, net_get_properties<ncclNetProperties_v11_t>, net_listen_v12,
    net_connect_v12, net_accept, reg_mr, reg_mr_dmabuf, dereg_mr, net_isend_v12, net_irecv_v12, net_iflush, net_test,
    net_close, net_close, net_close_listen, nullptr, nullptr, nullptr, net_finalize, nullptr};

RS_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName, net_init_v8, net_devices, net_get_properties<ncclNetProperties_v8_t>, net_listen_v8, net_connect_v8,
    net_accept, reg_mr, reg_mr_dmabuf, dereg_mr, net_isend_v8, net_irecv_v8, net_iflush, net_test, net_close,
    net_close, net_close_listen, nullptr, nullptr};

// NCCL 2.19 (the newest it knows).
RS_EXPORT ncclNet_v7_t ncclNetPlugin_v7 = {
    kPluginName, net_init_v7, net_devices, net_get_properties<ncclNetProperties_v7_t>, net_listen_v8, net_connect_v8,
    net_accept, reg_mr_v7, reg_mr_dmabuf, dereg_mr, net_isend_v8, net_irecv_v8, net_iflush, net_test, net_close,
    net_close, net_close_listen, nullptr, nullptr};

}  // extern "C"
