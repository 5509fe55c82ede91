#include "client/client_settings.h"

#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::client {

namespace {

using settings::spec;

static_assert(spec("streams").hi == proto::kMaxStreams, "RS_STREAMS' bound is the protocol's");
static_assert(spec("chunk_bytes").lo == proto::kMinChunkBytes && spec("chunk_bytes").hi == proto::kMaxChunkBytes,
              "RS_CHUNK_BYTES' bounds are the protocol's (protocol/plan.h: check_chunk_bytes)");

// The shared secret of RS_AUTH_TOKEN_FILE (trimmed); an unreadable or empty file names the variable.
std::string token_from_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  if (in) ss << in.rdbuf();
  std::optional<settings::Value> secret = settings::parse(spec("auth_token"), ss.str());
  if (!in || !secret)
    throw Error(ErrorKind::Config, std::string(spec("auth_token_file").env) + "='" + path +
                                       "' is not valid: the file cannot be read or is empty");
  const std::string warning = settings::secret_file_warning(path);
  if (!warning.empty()) log_warn(std::string(spec("auth_token_file").env) + ": " + warning);
  return std::get<std::string>(*secret);
}

}  // namespace

ClientOptions read_client_options(const settings::EnvLookup& env) {
  ClientOptions o;
  o.timeout = settings::read_seconds(spec("timeout"), env);
  o.connect_timeout = settings::read_seconds(spec("connect_timeout"), env);
  o.streams = int(settings::read_int(spec("streams"), env));
  const int64_t chunk = settings::read_int(spec("chunk_bytes"), env);
  const std::string why = proto::check_chunk_bytes(uint64_t(chunk));  // the client's, the ring's and the hello's rule
  if (!why.empty())
    throw Error(ErrorKind::Config, std::string(spec("chunk_bytes").env) + "='" +
                                       env(spec("chunk_bytes").env).value_or("") + "' is not valid: " + why);
  o.chunk_bytes = uint32_t(chunk);
  o.window = int(settings::read_int(spec("window"), env));
  o.max_rounds_in_flight = int(settings::read_int(spec("max_rounds_in_flight"), env));
  o.failover = settings::read_bool(spec("failover"), env);
  o.socket_buffer = int(settings::read_int(spec("socket_buffer"), env));
  if (auto token = settings::read_text(spec("auth_token"), env)) o.auth_token = *token;
  else if (auto file = settings::read_text(spec("auth_token_file"), env)) o.auth_token = token_from_file(*file);
  const std::optional<std::string> integrity = settings::read_text(spec("integrity"), env);
  o.integrity = integrity && *integrity != "off";  // a worker that asks for it never falls back
  return o;
}

}  // namespace rs::client
