// reducer._core.cluster: the cluster-description reader of csrc/cluster/ (the one the NCCL plugin
// uses) for reducer/cluster.py. Conversion only.
#include <string>

#include "bindings/common.h"
#include "cluster/job.h"
#include "cluster/spec.h"

namespace rs::py_bind {

namespace {

// A Python str as the bytes the C++ side reads: os.environ's stand-ins for bytes that are not
// UTF-8 become those bytes again (what the plugin reads from the same environment); any other
// surrogate passes as bytes that are not UTF-8. The JSON reader refuses both clearly.
std::string utf8_of(const py::handle& text) {
  if (!PyUnicode_Check(text.ptr()))
    throw py::type_error("expected a str, found " + std::string(py::str(py::type::handle_of(text))));
  PyObject* raw = PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogateescape");
  if (!raw) {
    PyErr_Clear();
    raw = PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass");
  }
  if (!raw) throw py::error_already_set();
  return std::string(py::reinterpret_steal<py::bytes>(raw));
}

}  // namespace

void bind_cluster(py::module_& parent) {
  py::module_ m = parent.def_submodule("cluster", "CLUSTER_SPEC / TF_CONFIG reading (csrc/cluster/spec.h)");
  py::class_<cluster::Spec>(m, "Spec", "A parsed cluster description (read-only).")
      .def_readonly("source", &cluster::Spec::source, "'CLUSTER_SPEC' or 'TF_CONFIG'")
      .def_readonly("task_type", &cluster::Spec::task_type, "this process's pool, as written")
      .def_readonly("index", &cluster::Spec::index, "this process's entry in that pool")
      .def_readonly("role", &cluster::Spec::role, "'worker', 'reducer' or 'evaluator'")
      .def_readonly("pools", &cluster::Spec::pools, "[(pool name, [address, ...]), ...] in document order")
      .def_readonly("worker_pools", &cluster::Spec::worker_pools, "the pools of worker nodes, in node order")
      .def_readonly("reducer_pool", &cluster::Spec::reducer_pool, "'workerpool2' or 'ps'")
      .def("pool_list", &cluster::Spec::pool_list, "the non-empty pools, sorted, for messages")
      .def("missing_reducers", &cluster::Spec::missing_reducers, "what to say when a worker finds no reducer pool");
  m.def(
      "parse_spec",
      [](const std::string& source, const py::str& text) { return cluster::parse_spec(source, utf8_of(text)); },
      py::arg("source"), py::arg("text"),
      "Parse the text of CLUSTER_SPEC or TF_CONFIG (`source`); ConfigError if it is malformed.");
  m.def(
      "spec_from_env",
      [](const py::object& lookup) {
        return cluster::spec_from_env([&lookup](const char* name) -> std::optional<std::string> {
          py::object value = lookup(name);
          if (value.is_none()) return std::nullopt;
          return utf8_of(value);
        });
      },
      py::arg("lookup"),
      "lookup(name) -> str or None reads the environment: CLUSTER_SPEC if set and not blank, else "
      "TF_CONFIG, parsed; None when neither is set. ConfigError if the one in force is malformed.");
  m.def(
      "resolve_job_id",
      [](const py::object& lookup, const std::string& explicit_id) {
        return cluster::resolve_job_id(
            [&lookup](const char* name) -> std::optional<std::string> {
              py::object value = lookup(name);
              if (value.is_none()) return std::nullopt;
              return utf8_of(value);
            },
            explicit_id);
      },
      py::arg("lookup"), py::arg("explicit_id") = "",
      "The job id: `explicit_id` if not blank, else RS_JOB_ID, else CLOUD_ML_JOB_ID, else 'local' "
      "(trimmed; blank counts as unset). The NCCL plugin uses the same rule.");
}

}  // namespace rs::py_bind
