// Transport defaults shared by the worker client, the ring and the reducer, in one place.
// reducer/config.py's settings table states the same values for RS_CHUNK_BYTES, RS_WINDOW and
// RS_STREAMS (the bindings export these as reducer._core.DEFAULTS; a test keeps them equal);
// RS_SOCKET_BUFFER unset means kDefaultSocketBuffer.
#pragma once

#include <cstdint>

namespace rs {

constexpr uint32_t kDefaultChunkBytes = 1u << 20;  // the largest pipeline chunk (RS_CHUNK_BYTES)
constexpr int kDefaultSocketBuffer = 4 << 20;      // SO_SNDBUF/SO_RCVBUF of data connections (RS_SOCKET_BUFFER)
constexpr int kDefaultWindow = 4;                  // worker chunks in flight per reducer connection (RS_WINDOW)
constexpr int kDefaultStreams = 1;                 // TCP connections per reducer per worker (RS_STREAMS)

}  // namespace rs
