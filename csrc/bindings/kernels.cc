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

// The float32 <-> 16-bit wire conversions: `f32` holds n float32, `w16` n float16/bfloat16.
rs::DType wire_arg(const std::string& wire, const BufView& f32, const BufView& w16, size_t* n) {
  rs::DType t = dtype_arg(wire);
  if (t != rs::DType::F16 && t != rs::DType::BF16)
    throw py::value_error("wire dtype must be float16 or bfloat16, got " + wire);
  if (f32.nbytes % 4) throw py::value_error("float32 buffer size is not a multiple of 4");
  *n = f32.nbytes / 4;
  if (w16.nbytes != *n * 2) throw py::value_error("the 16-bit buffer must hold as many elements as the float32 one");
  return t;
}

void kernels_narrow(const std::string& wire, py::buffer out, py::buffer in) {
  BufView ov = view_of(out, true), iv = view_of(in, false);
  size_t n = 0;
  rs::DType t = wire_arg(wire, iv, ov, &n);
  py::gil_scoped_release release;
  rs::kernels::narrow(t, const_cast<void*>(ov.ptr), static_cast<const float*>(iv.ptr), n);
}

void kernels_widen(const std::string& wire, py::buffer out, py::buffer in) {
  BufView ov = view_of(out, true), iv = view_of(in, false);
  size_t n = 0;
  rs::DType t = wire_arg(wire, ov, iv, &n);
  py::gil_scoped_release release;
  rs::kernels::widen(t, static_cast<float*>(const_cast<void*>(ov.ptr)), iv.ptr, n);
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("kernels_reduce", &kernels_reduce, py::arg("dtype"), py::arg("op"), py::arg("inputs"), py::arg("out"),
        "Reduce inputs (in rank order) into out with the reducer's kernels.");
  m.def("kernels_accumulate", &kernels_accumulate, py::arg("dtype"), py::arg("op"), py::arg("acc"), py::arg("x"),
        "acc op= x (acc in the accumulator type: float32 for float16/bfloat16).");
  m.def("kernels_narrow", &kernels_narrow, py::arg("wire_dtype"), py::arg("out"), py::arg("in_"),
        "out (float16/bfloat16 bits) = in (float32) rounded to nearest even, as the reducer rounds.");
  m.def("kernels_widen", &kernels_widen, py::arg("wire_dtype"), py::arg("out"), py::arg("in_"),
        "out (float32) = in (float16/bfloat16 bits) widened exactly.");
  m.def("kernels_isa", &rs::kernels::isa_name, "Instruction set the kernels dispatch to.");
  m.def("kernels_set_isa", &rs::kernels::set_isa, py::arg("name"),
        "Force 'scalar', 'avx2', 'avx512', 'avx512bf16' or 'auto'; returns False if this CPU lacks it.");
}

}  // namespace rs::py_bind
