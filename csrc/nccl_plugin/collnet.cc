#include "nccl_plugin/collnet.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "nccl_plugin/collnet_rounds.h"
#include "nccl_plugin/mem_region.h"
#include "nccl_plugin/plugin_env.h"
#include "nccl_plugin/plugin_log.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::nccl::collnet {

using proto::get_u16;
using proto::get_u32;
using proto::get_u64;
using proto::put_u16;
using proto::put_u32;
using proto::put_u64;

namespace {

// ---- the CollNet listen handle (128 bytes, little-endian) ----------------------------------
// [0,4) magic  [4,6) version  [8,24) nonce  [24,32) NCCL communicator id
// [32,40) fingerprint of (job id, reducer list)  [40,44) number of reducers  [44,108) host name
constexpr uint32_t kHandleMagic = 0x48434e52u;  // "RNCH"
constexpr uint16_t kVersion = 1;
constexpr size_t kNonceBytes = 16;
constexpr size_t kHostBytes = 64;

std::mutex g_mu;
std::optional<ReducerPool> g_pool;
std::string g_pool_error;  // why there is no pool ("" when none is configured)
bool g_discovered = false;  // init() ran at least once in this load of the library

struct Context {
  static constexpr uint32_t kMagic = 0x58434e52u;  // "RNCX"
  uint32_t magic = kMagic;
  uint64_t comm_id = 0;
};

struct ListenComm {
  static constexpr uint32_t kMagic = 0x4c434352u;  // "RCCL"
  uint32_t magic = kMagic;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  ReducerPool pool;
};

struct CollComm {
  static constexpr uint32_t kMagic = 0x43434352u;  // "RCCC"
  uint32_t magic = kMagic;
  std::string group;
  std::unique_ptr<CollNetRounds> rounds;
};

uint64_t fingerprint(const ReducerPool& p) {
  std::string text = p.job_id + "\n";
  for (const auto& r : p.reducers) text += r + ",";
  proto::Digest d = proto::sha256(text.data(), text.size());
  return get_u64(d.data());
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

std::string host_in(const uint8_t* h) {
  const char* p = reinterpret_cast<const char*>(h + 44);
  return std::string(p, strnlen(p, kHostBytes));
}

ReducerPool current_pool() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_pool) {
    throw Error(ErrorKind::Config, g_pool_error.empty()
                                       ? "no reducers configured (set RS_REDUCERS, or run under CLUSTER_SPEC / TF_CONFIG)"
                                       : g_pool_error);
  }
  return *g_pool;
}

CollComm* coll_of(void* c) {
  auto* cc = static_cast<CollComm*>(c);
  if (!cc || cc->magic != CollComm::kMagic) throw Error(ErrorKind::Internal, "not a CollNet communicator of this plugin");
  return cc;
}

const char* nccl_dtype_name(int t) {
  static const char* names[] = {"int8",    "uint8",   "int32",    "uint32",  "int64",  "uint64",
                                "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return t >= 0 && t < 12 ? names[t] : "unknown";
}

const char* nccl_op_name(int o) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return o >= 0 && o < 5 ? names[o] : "unknown";
}

}  // namespace

bool to_rs_dtype(int t, DType* out) {
  switch (t) {
    case ncclInt32: *out = DType::I32; return true;
    case ncclInt64: *out = DType::I64; return true;
    case ncclFloat16: *out = DType::F16; return true;
    case ncclFloat32: *out = DType::F32; return true;
    case ncclFloat64: *out = DType::F64; return true;
    case ncclBfloat16: *out = DType::BF16; return true;
    default: return false;  // 8-bit, unsigned and fp8 types: the reducers have no kernels for them
  }
}

bool to_rs_op(int o, Op* out) {
  switch (o) {
    case ncclSum: *out = Op::Sum; return true;
    case ncclMax: *out = Op::Max; return true;
    case ncclMin: *out = Op::Min; return true;
    // prod: no reducer kernel. avg: NCCL sends averages as sums (pre-scaled), never as avg;
    // the reducers' avg would divide by the number of heads, not of ranks.
    default: return false;
  }
}

void init() {
  std::optional<ReducerPool> pool;
  std::string error;
  try {
    pool = discover_reducers();
  } catch (const Error& e) {
    error = std::string("CollNet disabled: ") + e.what();
  }
  std::lock_guard<std::mutex> lock(g_mu);
  bool changed = !g_discovered || (pool.has_value() != g_pool.has_value()) || error != g_pool_error ||
                 (pool && g_pool && pool->reducers != g_pool->reducers);
  g_pool = pool;
  g_pool_error = error;
  g_discovered = true;
  if (!changed) return;
  if (!error.empty()) log_warn(error + " (CollNet init fails, so NCCL runs without CollNet)");
  else if (!pool)
    log_info("CollNet off: no reducers configured (RS_REDUCERS, CLUSTER_SPEC or TF_CONFIG); CollNet init fails, so "
             "NCCL runs without CollNet");
  else {
    std::string list;
    for (const auto& r : pool->reducers) list += (list.empty() ? "" : ",") + r;
    log_info("CollNet: " + std::to_string(pool->reducers.size()) + " reducer(s) from " + pool->source + ": " + list +
             " (job " + pool->job_id + ")");
  }
}

int devices() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_pool ? 1 : 0;
}

void* make_context(uint64_t comm_id) {
  auto c = std::make_unique<Context>();
  c->comm_id = comm_id;
  return c.release();
}

void free_context(void* ctx) {
  if (!ctx) return;
  auto* c = static_cast<Context*>(ctx);
  if (c->magic != Context::kMagic) throw Error(ErrorKind::Internal, "finalize: not a context of this plugin");
  std::unique_ptr<Context> owned(c);
  owned->magic = 0;
}

void listen(void* ctx, void* handle, void** listen_comm) {
  uint64_t comm_id = 0;
  if (ctx) {
    auto* c = static_cast<Context*>(ctx);
    if (c->magic != Context::kMagic) throw Error(ErrorKind::Internal, "listen: not a context of this plugin");
    comm_id = c->comm_id;
  }
  auto lc = std::make_unique<ListenComm>();
  lc->pool = current_pool();
  uint8_t* h = lc->handle;
  std::memset(h, 0, sizeof lc->handle);
  put_u32(h, kHandleMagic);
  put_u16(h + 4, kVersion);
  proto::random_bytes(h + 8, kNonceBytes);
  put_u64(h + 24, comm_id);
  put_u64(h + 32, fingerprint(lc->pool));
  put_u32(h + 40, uint32_t(lc->pool.reducers.size()));
  char host[kHostBytes + 1] = {};
  gethostname(host, kHostBytes);
  std::memcpy(h + 44, host, strnlen(host, kHostBytes));
  std::memcpy(handle, h, NCCL_NET_HANDLE_MAXSIZE);
  *listen_comm = lc.release();
}

void connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  *coll_comm = nullptr;
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (!lc || lc->magic != ListenComm::kMagic) throw Error(ErrorKind::Internal, "connect: not a listen comm of this plugin");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw Error(ErrorKind::Config, "connect: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  // Every check below depends only on the handles, which every head has the same copy of:
  // all heads take the same decision (NCCL needs all or none to fail).
  std::vector<const uint8_t*> h(static_cast<size_t>(nranks));
  for (int i = 0; i < nranks; ++i) {
    h[size_t(i)] = static_cast<const uint8_t*>(handles[i]);
    if (!h[size_t(i)] || get_u32(h[size_t(i)]) != kHandleMagic || get_u16(h[size_t(i)] + 4) != kVersion)
      throw Error(ErrorKind::Protocol, "connect: the handle of head " + std::to_string(i) +
                                           " is not from this plugin version (mixed plugin versions in one job?)");
  }
  for (int i = 1; i < nranks; ++i) {
    if (get_u64(h[size_t(i)] + 32) != get_u64(h[0] + 32) || get_u32(h[size_t(i)] + 40) != get_u32(h[0] + 40))
      throw Error(ErrorKind::Config, "connect: head " + std::to_string(i) + " (" + host_in(h[size_t(i)]) +
                                         ") has a different reducer pool or job id than head 0 (" + host_in(h[0]) +
                                         "): every node must see the same CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS and job id");
    if (get_u64(h[size_t(i)] + 24) != get_u64(h[0] + 24))
      throw Error(ErrorKind::Protocol, "connect: head " + std::to_string(i) + " belongs to another NCCL communicator");
  }
  if (std::memcmp(h[size_t(rank)] + 8, lc->handle + 8, kNonceBytes) != 0)
    throw Error(ErrorKind::Internal, "connect: handle " + std::to_string(rank) + " is not this head's own listen handle");
  // The group: communicator id and every head's nonce, in rank order.
  std::string ident;
  ident.append(reinterpret_cast<const char*>(h[0] + 24), 8);
  for (const uint8_t* x : h) ident.append(reinterpret_cast<const char*>(x + 8), kNonceBytes);
  proto::Digest d = proto::sha256(ident.data(), ident.size());

  auto cc = std::make_unique<CollComm>();
  cc->group = "nccl-" + hex(d.data(), 16);
  client::ClientOptions opts = client_options_from_env();
  if (!getenv_str("RS_WINDOW")) opts.window = kCollNetWindow;
  opts.reducers = lc->pool.reducers;
  opts.job_id = lc->pool.job_id;
  opts.group = cc->group;
  opts.rank = uint32_t(rank);
  opts.world_size = uint32_t(nranks);
  cc->rounds = std::make_unique<CollNetRounds>(opts, kMaxRoundsInFlight);
  log_info("CollNet connected: head " + std::to_string(rank) + " of " + std::to_string(nranks) + ", group " + cc->group +
           ", job " + opts.job_id + ", " + std::to_string(opts.reducers.size()) + " reducer(s) from " + lc->pool.source + ", up to " +
           std::to_string(kMaxRoundsInFlight) + " rounds in flight, window " + std::to_string(opts.window));
  *coll_comm = cc.release();
}

int reduce_support(int nccl_dtype, int nccl_op) {
  DType t;
  Op o;
  return to_rs_dtype(nccl_dtype, &t) && to_rs_op(nccl_op, &o) ? 1 : 0;
}

void iallreduce(void* coll_comm, void* send, void* recv, size_t count, int nccl_dtype, int nccl_op, void* send_mh,
                void* recv_mh, void** request) {
  *request = nullptr;
  CollComm* cc = coll_of(coll_comm);
  DType t;
  Op o;
  if (!to_rs_dtype(nccl_dtype, &t) || !to_rs_op(nccl_op, &o))
    throw Error(ErrorKind::Config, std::string("iallreduce: ") + nccl_op_name(nccl_op) + " of " +
                                       nccl_dtype_name(nccl_dtype) + " is not supported by the reducers "
                                       "(reduceSupport reports 0 for it)");
  const size_t es = dtype_size(t);
  if (count > kMaxCollBytes / es)
    throw Error(ErrorKind::Config, "iallreduce of " + std::to_string(count) + " elements: more than maxCollBytes");
  const size_t nbytes = count * es;
  if (nbytes && (!send || !recv)) throw Error(ErrorKind::Config, "iallreduce with a null buffer");
  const MemRegion* sr = region_of(send_mh);
  const MemRegion* rr = region_of(recv_mh);
  if (sr && !sr->contains(send, nbytes)) throw Error(ErrorKind::Config, "iallreduce: send buffer outside its registered region");
  if (rr && !rr->contains(recv, nbytes)) throw Error(ErrorKind::Config, "iallreduce: receive buffer outside its registered region");
  *request = cc->rounds->try_start(send, recv, nbytes, t, o);
}

void test(void* request, int* done, int* size) {
  size_t nbytes = 0;
  *done = CollNetRounds::test(request, &nbytes) ? 1 : 0;
  if (*done && size) *size = int(nbytes);
}

void close_coll(void* coll_comm) {
  if (!coll_comm) return;
  std::unique_ptr<CollComm> cc(coll_of(coll_comm));
  cc->magic = 0;
}

void close_listen(void* listen_comm) {
  if (!listen_comm) return;
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (lc->magic != ListenComm::kMagic) throw Error(ErrorKind::Internal, "closeListen: not a listen comm of this plugin");
  std::unique_ptr<ListenComm> owned(lc);
  owned->magic = 0;
}

}  // namespace rs::nccl::collnet
