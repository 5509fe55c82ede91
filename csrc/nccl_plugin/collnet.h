// CollNet: NCCL's inter-node all-reduce offload, here served by the reducer pool.
//
// One head rank per node calls it. listen() writes a handle with a random nonce, NCCL's
// communicator id and a fingerprint of this head's reducer pool and job; connect() gets every
// head's handle, checks they agree (the same decision on every head), derives the group name
// from all nonces (so communicators and jobs never share a group) and joins the group on the
// reducers as rank `rank` of `nranks`. iallreduce/test go through CollNetRounds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl::collnet {

// NCCL's data types / reduction ops as the reducers' (false: the reducers cannot do it).
bool to_rs_dtype(int nccl_dtype, DType* out);
bool to_rs_op(int nccl_op, Op* out);

// Reads the reducer pool (CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS); logs why CollNet is off.
void init();
int devices();                         // 1 with a reducer pool, else 0
void* make_context(uint64_t comm_id);  // what init(ctx, commId) hands back (v11+)
void free_context(void* ctx);

constexpr size_t kMaxCollBytes = size_t(1) << 30;  // per iallreduce (v8 passes counts as int)
constexpr int kMaxRoundsInFlight = 64;             // NCCL keeps at most 64 requests per collComm
// Chunks in flight per reducer connection when RS_WINDOW is not set. NCCL's calls are 32-256 KiB,
// so a reducer gets chunks of 64 KiB or less: the worker library's window (rs::kDefaultWindow, 4)
// would keep only 256 KiB in flight per connection (docs/nccl-plugin.md, docs/performance.md).
constexpr int kCollNetWindow = 8;

void listen(void* ctx, void* handle, void** listen_comm);
void connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm);
int reduce_support(int nccl_dtype, int nccl_op);
void iallreduce(void* coll_comm, void* send, void* recv, size_t count, int nccl_dtype, int nccl_op, void* send_mh,
                void* recv_mh, void** request);
void test(void* request, int* done, int* size);
void close_coll(void* coll_comm);
void close_listen(void* listen_comm);

}  // namespace rs::nccl::collnet
