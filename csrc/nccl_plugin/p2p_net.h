// The point-to-point TCP net NCCL uses between nodes once it loads this library (it replaces
// NCCL's built-in socket/IB transports for the communicator, so it must carry all p2p traffic).
//
// Connections: listen() puts the address and a random nonce in NCCL's 128-byte handle;
// connect() opens RS_NCCL_NSOCKS sockets to it and sends a hello on each (a non-blocking state
// machine kept in the handle's tail, returning a NULL comm until done); accept() collects the
// hellos and groups them by connection id (p2p_listen.h: bounded against silent or junk peers). Messages are FIFO per
// comm; message k goes out as a 16-byte header (magic, size) on socket 0, and its bytes are striped over the sockets in
// contiguous pieces of at least 64 KiB (smaller messages use socket 0 only). One progress thread per comm does all
// socket I/O (poll + an eventfd to wake it); isend/irecv/test only touch a fixed ring of NCCL_NET_MAX_REQUESTS request
// slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl_plugin/plugin_env.h"

namespace rs::nccl::p2p {

// Picks the interface (plugin_env.h); idempotent. Throws Config if none is usable.
void init();
const NetInterface& interface();

// All of these throw rs::Error; the C entry points translate (plugin_log.h guarded()).
void listen(void* handle, void** listen_comm);
void connect(void* handle, void** send_comm);                          // *send_comm = nullptr: call again
void accept(void* listen_comm, void** recv_comm);                      // *recv_comm = nullptr: call again
void isend(void* send_comm, void* data, size_t size, void** request);  // nullptr: retry
void irecv(void* recv_comm, int n, void** data, const size_t* sizes, void** request);  // nullptr: retry
void test(void* request, int* done, int* size);
void close_comm(void* comm);  // send or receive comm; joins its thread
void close_listen(void* listen_comm);

constexpr size_t kMaxMessageBytes = size_t(1) << 30;  // maxP2pBytes (sizes reach NCCL as int)
constexpr uint64_t kMinStripeBytes = 64 << 10;

// Byte range [*off, *off + *len) of a message of `size` bytes that socket `s` of `nsocks` carries.
void stripe(uint64_t size, int nsocks, int s, uint64_t* off, uint64_t* len);

}  // namespace rs::nccl::p2p
