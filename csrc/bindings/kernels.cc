// Kernel entry points of reducer._core (tests and benchmarks of csrc/kernels).
#include <vector>

#include "bindings/common.h"
#include "kernels/kernels.h"

namespace rs::py_bind {

namespace {

// Reduce `inputs` (rank order) into `out` exactly as the reducer does for one chunk.
void kernels_reduce(const std::string& dtype, const std::string& op, const std::vector<py::buffer>& inputs,
                    py::buffer out) {
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  if (inputs.empty()) throw py::value_error("need at least one input");
  BufView ov = view_of(out, true);
  std::vector<BufView> iv;
  for (auto& b : inputs) {
    iv.push_back(view_of(b, false));
    if (iv.back().nbytes != ov.nbytes) throw py::value_error("all inputs must have the size of out");
  }
  size_t es = rs::dtype_size(t);
  if (ov.nbytes % es) throw py::value_error("buffer size is not a multiple of the dtype size");
  size_t n = ov.nbytes / es;
  std::vector<unsigned char> acc(n * rs::acc_elem_size(t));
  {
    py::gil_scoped_release release;
    rs::kernels::init(t, acc.data(), iv[0].ptr, n);
    for (size_t k = 1; k < iv.size(); ++k) rs::kernels::accumulate(t, o, acc.data(), iv[k].ptr, n);
    rs::kernels::finalize(t, o, const_cast<void*>(ov.ptr), acc.data(), n, static_cast<uint32_t>(iv.size()));
  }
}

// One accumulate pass (acc op= x) for benchmarks: acc uses the accumulator type.
void kernels_accumulate(const std::string& dtype, const std::string& op, py::buffer acc, py::buffer x) {
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  BufView av = view_of(acc, true), xv = view_of(x, false);
  size_t n = xv.nbytes / rs::dtype_size(t);
  if (av.nbytes < n * rs::acc_elem_size(t)) throw py::value_error("accumulator too small");
  py::gil_scoped_release release;
  rs::kernels::accumulate(t, o, const_cast<void*>(av.ptr), xv.ptr, n);
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("kernels_reduce", &kernels_reduce, py::arg("dtype"), py::arg("op"), py::arg("inputs"), py::arg("out"),
        "Reduce inputs (in rank order) into out with the reducer's kernels.");
  m.def("kernels_accumulate", &kernels_accumulate, py::arg("dtype"), py::arg("op"), py::arg("acc"), py::arg("x"),
        "acc op= x (acc in the accumulator type: float32 for float16/bfloat16).");
  m.def("kernels_isa", &rs::kernels::isa_name, "Instruction set the kernels dispatch to.");
  m.def("kernels_set_isa", &rs::kernels::set_isa, py::arg("name"),
        "Force 'scalar', 'avx2', 'avx512' or 'auto'; returns False if this CPU lacks it.");

}

}  // namespace rs::py_bind
