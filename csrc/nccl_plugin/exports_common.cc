#include "nccl_plugin/exports_common.h"

#include <cstring>
#include <string>

#include "nccl_plugin/collnet.h"
#include "nccl_plugin/mem_region.h"
#include "nccl_plugin/p2p_net.h"
#include "nccl_plugin/plugin_log.h"

namespace rs::nccl {

void fill_properties(Side side, int dev, ncclNetProperties_v12_t* p) {
  const int ndev = side == Side::Net ? 1 : collnet::devices();
  if (dev < 0 || dev >= ndev) throw Error(ErrorKind::Config, "device " + std::to_string(dev) + " does not exist");
  // The same NIC for point-to-point and CollNet (NCCL then sees one NIC that can do both). The
  // interface is chosen once per load, so its strings live as long as the library.
  const NetInterface& ni = p2p::interface();
  std::memset(p, 0, sizeof *p);
  p->name = const_cast<char*>(ni.name.c_str());
  p->pciPath = ni.pci_path.empty() ? nullptr : const_cast<char*>(ni.pci_path.c_str());
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
  p->maxCollBytes = collnet::kMaxCollBytes;
  p->maxMultiRequestSize = 1;
  p->railId = NCCL_NET_ID_UNDEF;
  p->planeId = NCCL_NET_ID_UNDEF;
}

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v12_t* p) { *p = a; }

namespace {

// The members every layout has (v7's), then each newer layout's own.
template <class P>
void copy_common(const ncclNetProperties_v12_t& a, P* p) {
  std::memset(p, 0, sizeof *p);
  p->name = a.name;
  p->pciPath = a.pciPath;
  p->guid = a.guid;
  p->ptrSupport = a.ptrSupport;
  p->speed = a.speed;
  p->port = a.port;
  p->latency = a.latency;
  p->maxComms = a.maxComms;
  p->maxRecvs = a.maxRecvs;
  p->netDeviceType = a.netDeviceType;
  p->netDeviceVersion = a.netDeviceVersion;
}

}  // namespace

namespace {

// v9 to v11: the v7 members, the flags, four virtual-device slots and the size limits.
template <class P>
void copy_v9_on(const ncclNetProperties_v12_t& a, P* p) {
  copy_common(a, p);
  p->regIsGlobal = a.regIsGlobal;
  p->forceFlush = a.forceFlush;
  p->vProps.ndevs = a.vProps.ndevs;
  for (int i = 0; i < a.vProps.ndevs && i < 4; ++i) p->vProps.devs[i] = a.vProps.devs[i];
  p->maxP2pBytes = a.maxP2pBytes;
  p->maxCollBytes = a.maxCollBytes;
}

}  // namespace

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v11_t* p) {
  copy_v9_on(a, p);
  p->maxMultiRequestSize = a.maxMultiRequestSize;
}

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v10_t* p) { copy_v9_on(a, p); }

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v8_t* p) {
  copy_common(a, p);
  p->regIsGlobal = a.regIsGlobal;
}

void convert(const ncclNetProperties_v12_t& a, ncclNetProperties_v7_t* p) { copy_common(a, p); }

template <class Props>
ncclResult_t get_properties(Side side, int dev, Props* props) noexcept {
  return run_guarded(side == Side::Net ? "getProperties" : "CollNet getProperties", [&] {
    ncclNetProperties_v12_t p;
    fill_properties(side, dev, &p);
    convert(p, props);
  });
}

template ncclResult_t get_properties(Side, int, ncclNetProperties_v12_t*) noexcept;
template ncclResult_t get_properties(Side, int, ncclNetProperties_v11_t*) noexcept;
template ncclResult_t get_properties(Side, int, ncclNetProperties_v10_t*) noexcept;
template ncclResult_t get_properties(Side, int, ncclNetProperties_v8_t*) noexcept;
template ncclResult_t get_properties(Side, int, ncclNetProperties_v7_t*) noexcept;

ncclResult_t reg_mr(void*, void* data, size_t size, int type, void** mhandle) noexcept {
  return run_guarded("regMr", [&] {
    *mhandle = nullptr;
    *mhandle = register_region(data, size, type);
  });
}

ncclResult_t reg_mr_v7(void* comm, void* data, int size, int type, void** mhandle) noexcept {
  if (size < 0) {
    *mhandle = nullptr;
    return run_guarded("regMr", [] { throw Error(ErrorKind::Config, "negative size"); });
  }
  return reg_mr(comm, data, size_t(size), type, mhandle);
}

ncclResult_t reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) noexcept {
  *mhandle = nullptr;
  return run_guarded("regMrDmaBuf", [] {
    throw Error(ErrorKind::Config, "DMA-BUF memory is not supported: this plugin moves host memory only");
  });
}

ncclResult_t dereg_mr(void*, void* mhandle) noexcept {
  return run_guarded("deregMr", [&] { deregister_region(mhandle); });
}

}  // namespace rs::nccl
