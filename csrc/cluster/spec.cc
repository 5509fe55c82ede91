#include "cluster/spec.h"

#include <algorithm>
#include <limits>

#include "cluster/repr.h"
#include "common/error.h"
#include "common/json.h"

namespace rs::cluster {

namespace {

using json::Value;
using Type = json::Value::Type;

struct PoolKind {
  const char* type;         // the task type / pool name
  const char* description;  // "primary", "workers", "reducers", "evaluators"
  const char* role;         // kWorker, kReducer, kEvaluator
};

struct Source {
  const char* name;
  std::vector<PoolKind> kinds;  // in the order the "unknown task type" message lists them
  std::vector<std::string> worker_pools;
  const char* reducer_pool;
  const char* missing_reducers_hint;
};

const Source& source_of(const std::string& name) {
  static const Source kVertex{"CLUSTER_SPEC",
                              {{"workerpool0", "primary", kWorker},
                               {"workerpool1", "workers", kWorker},
                               {"workerpool2", "reducers", kReducer},
                               {"workerpool3", "evaluators", kEvaluator}},
                              {"workerpool0", "workerpool1"},
                              "workerpool2",
                              "add a reduction-server pool as workerPoolSpecs[2]"};
  static const Source kTf{"TF_CONFIG",
                          {{"chief", "primary", kWorker},
                           {"master", "primary", kWorker},
                           {"worker", "workers", kWorker},
                           {"ps", "reducers", kReducer},
                           {"evaluator", "evaluators", kEvaluator}},
                          {"chief", "master", "worker"},
                          "ps",
                          "add reduction-server replicas as parameter servers"};
  if (name == kVertex.name) return kVertex;
  if (name == kTf.name) return kTf;
  throw Error(ErrorKind::Internal, "unknown cluster description source " + py_repr(name));
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::Config, source + " " + what);
}

std::string trimmed(const std::string& s) {
  const char* ws = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(ws);
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(ws) - b + 1);
}

Value load(const std::string& source, const std::string& text) {
  Value doc;
  try {
    doc = json::parse(text, source);
  } catch (const Error& e) {
    // As the message of Python's json module: the reason, then the start of what was found.
    throw Error(ErrorKind::Config, std::string(e.what()) + ": " + py_repr(trimmed(text).substr(0, 80)));
  }
  if (doc.type != Type::Object)
    fail(source, std::string("must be a JSON object with 'cluster' and 'task', found ") + py_type_name(doc));
  std::string missing;
  for (const char* key : {"cluster", "task"})
    if (!doc.get(key)) missing += std::string(missing.empty() ? "'" : " or '") + key + "'";
  if (!missing.empty()) {
    std::vector<std::string> keys = doc.keys;
    std::sort(keys.begin(), keys.end());
    std::string found;
    for (const auto& k : keys) found += (found.empty() ? "" : ", ") + k;
    fail(source, "has no " + missing + " key: found keys " + (found.empty() ? "(none)" : found));
  }
  return doc;
}

// `cluster` is an object; `task` below too.
void read_pools(const std::string& source, const Value& cluster, Spec* spec) {
  for (const auto& name : cluster.keys) {
    const Value& entries = cluster.members.at(name);
    std::vector<std::string> addrs;
    bool ok = entries.type == Type::Null || entries.type == Type::Array;
    for (size_t i = 0; ok && entries.type == Type::Array && i < entries.items.size(); ++i) {
      ok = entries.items[i].type == Type::String;
      if (ok) addrs.push_back(entries.items[i].text);
    }
    if (!ok)
      fail(source, "pool " + py_repr(name) + " must be a list of 'host:port' strings, found " + py_repr(entries));
    spec->pools.emplace_back(name, std::move(addrs));
  }
}

// The task's index: an integer >= 0, or a string of digits (as some launchers write it).
int64_t read_index(const std::string& source, const Value* index) {
  if (!index) return 0;
  std::string digits;
  if (index->type == Type::Number && index->text.find_first_of(".eE") == std::string::npos) {
    digits =
        index->text[0] == '-' ? (index->text.find_first_not_of("-0") == std::string::npos ? "0" : "") : index->text;
  } else if (index->type == Type::String) {
    digits = trimmed(index->text);
    if (digits.find_first_not_of("0123456789") != std::string::npos) digits.clear();
  }
  if (digits.empty()) fail(source, "task index " + py_repr(*index) + " is not a non-negative integer");
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size() - 1);
  digits = digits.substr(first);  // as Python's int() reads it, without leading zeros
  if (digits.size() > 18) return std::numeric_limits<int64_t>::max();  // out of range of any pool
  return std::stoll(digits);
}

const PoolKind* kind_of(const Source& src, const Value* type) {
  if (!type || type->type != Type::String) return nullptr;
  for (const auto& k : src.kinds)
    if (type->text == k.type) return &k;
  return nullptr;
}

void read_task(const Source& src, const Value& task, Spec* spec) {
  const std::string source = src.name;
  const Value* type = task.get("type");
  if (!type || type->type == Type::Null) fail(source, "'task' has no 'type': found " + py_repr(task));
  const PoolKind* kind = kind_of(src, type);
  if (!kind) {
    std::string expected;
    for (const auto& k : src.kinds)
      expected += (expected.empty() ? "" : ", ") + std::string(k.type) + " (" + k.description + ")";
    fail(source, "task type " + py_repr(*type) + " is unknown: expected one of " + expected);
  }
  spec->task_type = kind->type;
  spec->role = kind->role;
  spec->index = read_index(source, task.get("index"));
  const auto& own = spec->pool(spec->task_type);
  // TF_CONFIG never lists evaluators in its cluster; Vertex may omit them too.
  if (spec->role != kEvaluator || !own.empty()) {
    if (own.empty())
      fail(source, "task type is " + py_repr(spec->task_type) + " but the cluster has no " + py_repr(spec->task_type) +
                       " pool: found pools " + spec->pool_list());
    if (uint64_t(spec->index) >= own.size())
      fail(source, "task index " + std::to_string(spec->index) + " is out of range: pool " + py_repr(spec->task_type) +
                       " has " + std::to_string(own.size()) + (own.size() == 1 ? " entry" : " entries"));
  }
}

}  // namespace

const std::vector<std::string>& Spec::pool(const std::string& name) const {
  static const std::vector<std::string> kNone;
  for (const auto& p : pools)
    if (p.first == name) return p.second;
  return kNone;
}

std::string Spec::pool_list() const {
  std::vector<std::string> names;
  for (const auto& p : pools)
    if (!p.second.empty()) names.push_back(p.first);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

std::string Spec::missing_reducers() const {
  const Source& src = source_of(source);
  const std::string pool = source == "CLUSTER_SPEC" ? reducer_pool : "'" + reducer_pool + "' pool";
  return source + " has no " + pool + " (reducers): found pools " + pool_list() + "; " + src.missing_reducers_hint;
}

Spec parse_spec(const std::string& source, const std::string& text) {
  const Source& src = source_of(source);
  const Value doc = load(source, text);
  Spec spec;
  spec.source = source;
  spec.worker_pools = src.worker_pools;
  spec.reducer_pool = src.reducer_pool;
  const Value& cluster = *doc.get("cluster");
  const Value& task = *doc.get("task");
  if (cluster.type != Type::Object)
    fail(source, "'cluster' must be an object of pool name -> address list, found " + py_repr(cluster));
  if (task.type != Type::Object)
    fail(source, "'task' must be an object with 'type' and 'index', found " + py_repr(task));
  read_pools(source, cluster, &spec);
  read_task(src, task, &spec);
  if (source == "TF_CONFIG" && !spec.pool("chief").empty() && !spec.pool("master").empty())
    fail(source, "has both a 'chief' and a 'master' pool: expected only one of them");
  return spec;
}

bool blank(const std::string& s) { return trimmed(s).empty(); }

std::optional<Spec> spec_from_env(const Lookup& env) {
  for (const char* var : {"CLUSTER_SPEC", "TF_CONFIG"}) {
    const std::optional<std::string> text = env(var);
    if (text && !blank(*text)) return parse_spec(var, *text);
  }
  return std::nullopt;
}

}  // namespace rs::cluster
