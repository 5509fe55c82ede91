// The worker client's options from RS_* variables, through the settings table
// (common/settings.h): the one reader of RS_TIMEOUT, RS_CONNECT_TIMEOUT, RS_STREAMS,
// RS_CHUNK_BYTES, RS_WINDOW, RS_MAX_ROUNDS_IN_FLIGHT, RS_FAILOVER, RS_SOCKET_BUFFER,
// RS_AUTH_TOKEN / RS_AUTH_TOKEN_FILE and RS_INTEGRITY. The NCCL plugin uses it with the process
// environment; reducer._core.read_client_options exposes it to the tests.
#pragma once

#include "client/client.h"
#include "common/settings.h"

namespace rs::client {

// ClientOptions with every setting above taken from `env` (unset or blank: the default).
// reducers, rank, world_size, group and job_id stay the caller's. A malformed value is an
// Error(Config) naming the variable (RS_CHUNK_BYTES also by the protocol's chunk rule;
// RS_AUTH_TOKEN_FILE when the file cannot be read or is empty).
ClientOptions read_client_options(const settings::EnvLookup& env);

}  // namespace rs::client
