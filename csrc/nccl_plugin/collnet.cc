#include "nccl_plugin/collnet.h"

#include <unistd.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "client/peer_text.h"
#include "common/error.h"
#include "common/settings.h"
#include "common/text.h"
#include "nccl_plugin/collnet_handle.h"
#include "nccl_plugin/collnet_rounds.h"
#include "nccl_plugin/mem_region.h"
#include "nccl_plugin/plugin_env.h"
#include "nccl_plugin/plugin_log.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::nccl::collnet {

namespace {

std::mutex g_mu;
std::optional<ReducerPool> g_pool;
std::string g_pool_error;   // why there is no pool ("" when none is configured)
bool g_discovered = false;  // init() ran at least once in this load of the library

// The objects NCCL holds for us as void*: each starts with its own magic, checked by ours<T>()
// whenever one comes back, and cleared when it is freed.
struct Context {
  static constexpr uint32_t kMagic = 0x58434e52u;  // "RNCX"
  static constexpr const char* kWhat = "context";
  uint32_t magic = kMagic;
  uint64_t comm_id = 0;
};

struct ListenComm {
  static constexpr uint32_t kMagic = 0x4c434352u;  // "RCCL"
  static constexpr const char* kWhat = "listen comm";
  uint32_t magic = kMagic;
  Handle own;  // what listen() gave NCCL
  ReducerPool pool;
};

struct CollComm {
  static constexpr uint32_t kMagic = 0x43434352u;  // "RCCC"
  static constexpr const char* kWhat = "CollNet communicator";
  uint32_t magic = kMagic;
  std::string group;
  std::unique_ptr<CollNetRounds> rounds;
};

template <class T>
T* ours(void* p, const char* call) {
  auto* t = static_cast<T*>(p);
  if (!t || t->magic != T::kMagic)
    throw Error(ErrorKind::Internal, std::string(call) + ": not a " + T::kWhat + " of this plugin");
  return t;
}

// Takes ownership of one of ours and clears its magic (a second free is caught by ours<T>()).
template <class T>
std::unique_ptr<T> release(void* p, const char* call) {
  std::unique_ptr<T> owned(ours<T>(p, call));
  owned->magic = 0;
  return owned;
}

uint64_t fingerprint(const ReducerPool& p) {
  std::string text = p.job_id + "\n";
  for (const auto& r : p.reducers) text += r + ",";
  proto::Digest d = proto::sha256(text.data(), text.size());
  return proto::get_u64(d.data());
}

ReducerPool current_pool() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_pool) {
    throw Error(ErrorKind::Config,
                g_pool_error.empty() ? "no reducers configured (set RS_REDUCERS, or run under CLUSTER_SPEC / TF_CONFIG)"
                                     : g_pool_error);
  }
  return *g_pool;
}

const char* nccl_dtype_name(int t) {
  static const char* names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",   "uint64",
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
    log_info(
        "CollNet off: no reducers configured (RS_REDUCERS, CLUSTER_SPEC or TF_CONFIG); CollNet init fails, so "
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
  if (ctx) release<Context>(ctx, "finalize");
}

void listen(void* ctx, void* handle, void** listen_comm) {
  auto lc = std::make_unique<ListenComm>();
  lc->pool = current_pool();
  Handle& h = lc->own;
  proto::random_bytes(h.nonce.data(), h.nonce.size());
  h.comm_id = ctx ? ours<Context>(ctx, "listen")->comm_id : 0;  // v8-v10 have no context
  h.pool_fingerprint = fingerprint(lc->pool);
  h.reducers = uint32_t(lc->pool.reducers.size());
  char host[kHandleHostBytes + 1] = {};
  gethostname(host, kHandleHostBytes);
  h.host = host;
  encode_handle(h, static_cast<uint8_t*>(handle), kHandleBytes);  // NCCL's buffer: 128 bytes
  *listen_comm = lc.release();
}

void connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  *coll_comm = nullptr;
  ListenComm* lc = ours<ListenComm>(listen_comm, "connect");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw Error(ErrorKind::Config, "connect: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  // Every check below depends only on the handles, which every head has the same copy of:
  // all heads take the same decision (NCCL needs all or none to fail).
  std::vector<Handle> h;
  h.reserve(size_t(nranks));
  for (int i = 0; i < nranks; ++i)
    h.push_back(decode_handle(static_cast<const uint8_t*>(handles[i]), kHandleBytes,
                              "connect: the handle of head " + std::to_string(i)));
  for (size_t i = 1; i < h.size(); ++i) {
    if (h[i].pool_fingerprint != h[0].pool_fingerprint || h[i].reducers != h[0].reducers)
      throw Error(ErrorKind::Config,
                  "connect: head " + std::to_string(i) + " (" + client::peer_text(h[i].host) +
                      ") has a different reducer pool or job id than head 0 (" + client::peer_text(h[0].host) +
                      "): every node must see the same CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS and job id");
    if (h[i].comm_id != h[0].comm_id)
      throw Error(ErrorKind::Protocol, "connect: head " + std::to_string(i) + " belongs to another NCCL communicator");
  }
  if (h[size_t(rank)].nonce != lc->own.nonce)
    throw Error(ErrorKind::Internal,
                "connect: handle " + std::to_string(rank) + " is not this head's own listen handle");
  // The group: communicator id (little-endian) and every head's nonce, in rank order.
  uint8_t comm_id[8];
  proto::put_u64(comm_id, h[0].comm_id);
  std::string ident(reinterpret_cast<const char*>(comm_id), sizeof comm_id);
  for (const Handle& x : h) ident.append(reinterpret_cast<const char*>(x.nonce.data()), x.nonce.size());
  proto::Digest d = proto::sha256(ident.data(), ident.size());

  auto cc = std::make_unique<CollComm>();
  cc->group = "nccl-" + rs::hex_bytes(d.data(), 16);
  client::ClientOptions opts = client_options_from_env();
  if (!settings::read(settings::spec("window"), settings::process_env())) opts.window = kCollNetWindow;
  opts.reducers = lc->pool.reducers;
  opts.job_id = lc->pool.job_id;
  opts.group = cc->group;
  opts.rank = uint32_t(rank);
  opts.world_size = uint32_t(nranks);
  cc->rounds = std::make_unique<CollNetRounds>(opts, kMaxRoundsInFlight);
  log_info("CollNet connected: head " + std::to_string(rank) + " of " + std::to_string(nranks) + ", group " +
           cc->group + ", job " + opts.job_id + ", " + std::to_string(opts.reducers.size()) + " reducer(s) from " +
           lc->pool.source + ", up to " + std::to_string(kMaxRoundsInFlight) + " rounds in flight, window " +
           std::to_string(opts.window));
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
  CollComm* cc = ours<CollComm>(coll_comm, "iallreduce");
  DType t;
  Op o;
  if (!to_rs_dtype(nccl_dtype, &t) || !to_rs_op(nccl_op, &o))
    throw Error(ErrorKind::Config, std::string("iallreduce: ") + nccl_op_name(nccl_op) + " of " +
                                       nccl_dtype_name(nccl_dtype) +
                                       " is not supported by the reducers "
                                       "(reduceSupport reports 0 for it)");
  const size_t es = dtype_size(t);
  if (count > kMaxCollBytes / es)
    throw Error(ErrorKind::Config, "iallreduce of " + std::to_string(count) + " elements: more than maxCollBytes");
  const size_t nbytes = count * es;
  if (nbytes && (!send || !recv)) throw Error(ErrorKind::Config, "iallreduce with a null buffer");
  const MemRegion* sr = region_of(send_mh);
  const MemRegion* rr = region_of(recv_mh);
  if (sr && !sr->contains(send, nbytes))
    throw Error(ErrorKind::Config, "iallreduce: send buffer outside its registered region");
  if (rr && !rr->contains(recv, nbytes))
    throw Error(ErrorKind::Config, "iallreduce: receive buffer outside its registered region");
  *request = cc->rounds->try_start(send, recv, nbytes, t, o);
}

void test(void* request, int* done, int* size) {
  size_t nbytes = 0;
  *done = CollNetRounds::test(request, &nbytes) ? 1 : 0;
  if (*done && size) *size = int(nbytes);
}

void close_coll(void* coll_comm) {
  if (coll_comm) release<CollComm>(coll_comm, "closeColl");
}

void close_listen(void* listen_comm) {
  if (listen_comm) release<ListenComm>(listen_comm, "closeListen");
}

}  // namespace rs::nccl::collnet
