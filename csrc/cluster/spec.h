// Cluster descriptions: the text of CLUSTER_SPEC (Vertex AI) or TF_CONFIG read into a plain
// structure, with every check and message the user sees when it is malformed. One implementation
// for the worker library (reducer/cluster.py, through reducer._core.cluster) and the NCCL plugin
// (csrc/nccl_plugin/plugin_env.cc); what follows from it (ranks, ports, the reducer addresses) is
// each caller's. docs/configuration.md, "Cluster discovery", describes the sources.
//
// CLUSTER_SPEC: workers are workerpool0 (the primary) then workerpool1, reducers workerpool2,
// evaluators workerpool3. TF_CONFIG: chief (or master) then worker are workers, ps the reducers,
// evaluator is excluded. Every malformed description is an rs::Error(Config) naming the variable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rs::cluster {

inline constexpr const char* kWorker = "worker";
inline constexpr const char* kReducer = "reducer";
inline constexpr const char* kEvaluator = "evaluator";

struct Spec {
  std::string source;     // "CLUSTER_SPEC" or "TF_CONFIG"
  std::string task_type;  // this process's pool, as written: "workerpool2", "ps", ...
  int64_t index = 0;      // this process's entry in that pool
  std::string role;       // kWorker, kReducer or kEvaluator
  // Every pool of the description in document order, entries as written (null counts as empty).
  std::vector<std::pair<std::string, std::vector<std::string>>> pools;
  std::vector<std::string> worker_pools;  // the pools whose entries are worker nodes, in node order
  std::string reducer_pool;               // "workerpool2" or "ps"

  // The entries of pool `name` (empty when the description has no such pool).
  const std::vector<std::string>& pool(const std::string& name) const;
  // The non-empty pools, sorted, comma-separated; "(none)" when there is none.
  std::string pool_list() const;
  // "CLUSTER_SPEC has no workerpool2 (reducers): found pools ...; add a reduction-server pool as
  // workerPoolSpecs[2]": what to say when a worker finds no reducer pool.
  std::string missing_reducers() const;
};

// Reads `text` (the value of `source`, "CLUSTER_SPEC" or "TF_CONFIG"). Throws rs::Error(Config):
// not JSON (with the start of the text), not an object with 'cluster' and 'task', a pool that is
// not a list of strings, an unknown task type, a task index out of range, chief and master both.
Spec parse_spec(const std::string& source, const std::string& text);

// The environment, as the caller sees it: a variable's value, nullopt when unset.
using Lookup = std::function<std::optional<std::string>(const char* name)>;
// CLUSTER_SPEC if set and not blank, else TF_CONFIG likewise, parsed; nullopt when neither is set.
std::optional<Spec> spec_from_env(const Lookup& env);

// True when `s` is empty or only blanks (space, tab, CR, LF, VT, FF): such a variable is unset.
bool blank(const std::string& s);

}  // namespace rs::cluster
