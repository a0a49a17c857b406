// bindings/python/muladd.cpp: the muladd family as a NumPy module, without PyTorch.
//
//   muladd(a, b, c, device="cpu") -> a * b + c      mul(a, b, device="cpu") -> a * b
// a, b: float32 or float64 arrays of one shape, any strides (other dtypes become float32).
// device="cuda" copies the inputs to the GPU, runs the same CUDA kernel as torch.ops.wb.muladd
// on a stream of its own, and copies the result back (built only with CUDA).
// Build and import:  workbench.standalone.load("muladd")
#include "muladd/muladd.h"

#include <string>

#include "wb/dtypes.h"
#include "wb/numpy.h"

namespace {

namespace py = pybind11;
using wb::Array;

void check_device(const std::string& device) {
#ifdef WB_WITH_CUDA
  if (device == "cuda") return;
#endif
  if (device != "cpu") {
    throw py::value_error("device must be 'cpu'" +
                          std::string(
#ifdef WB_WITH_CUDA
                              " or 'cuda'"
#else
                              " (this module was built without CUDA)"
#endif
                              ) +
                          ", got '" + device + "'");
  }
}

template <typename T>
wb::Contiguous<T> muladd(const Array<T>& a_in, const Array<T>& b_in, double c,
                         const std::string& device) {
  wb::check_same_shape("muladd", a_in, "a", b_in, "b");
  const wb::Contiguous<T> a = wb::contiguous(a_in), b = wb::contiguous(b_in);
  check_device(device);
  wb::Contiguous<T> out = wb::empty_like(a);
  const int64_t n = a.size();
#ifdef WB_WITH_CUDA
  if (device == "cuda") {
    wb::CudaStream stream;
    wb::DeviceBuffer<T> da(n), db(n), dout(n);
    da.upload(a.data(), stream);
    db.upload(b.data(), stream);
    wb::check_status("muladd",
                     wb::muladd::muladd_cuda(da.get(), db.get(), c, dout.get(), n, stream.get()));
    dout.download(out.mutable_data(), stream);
    return out;
  }
#endif
  py::gil_scoped_release release;
  wb::muladd::muladd_cpu(a.data(), b.data(), c, out.mutable_data(), 0, n);
  return out;
}

template <typename T>
wb::Contiguous<T> mul(const Array<T>& a_in, const Array<T>& b_in, const std::string& device) {
  wb::check_same_shape("mul", a_in, "a", b_in, "b");
  const wb::Contiguous<T> a = wb::contiguous(a_in), b = wb::contiguous(b_in);
  check_device(device);
  wb::Contiguous<T> out = wb::empty_like(a);
  const int64_t n = a.size();
#ifdef WB_WITH_CUDA
  if (device == "cuda") {
    wb::CudaStream stream;
    wb::DeviceBuffer<T> da(n), db(n), dout(n);
    da.upload(a.data(), stream);
    db.upload(b.data(), stream);
    wb::check_status("mul", wb::muladd::mul_cuda(da.get(), db.get(), dout.get(), n, stream.get()));
    dout.download(out.mutable_data(), stream);
    return out;
  }
#endif
  py::gil_scoped_release release;
  wb::muladd::mul_cpu(a.data(), b.data(), out.mutable_data(), 0, n);
  return out;
}

}  // namespace

PYBIND11_MODULE(WB_MODULE_NAME, m) {
  m.doc() = "The muladd kernels over NumPy arrays (no PyTorch).";
  m.def("muladd", &muladd<float>, py::arg("a"), py::arg("b"), py::arg("c"),
        py::arg("device") = "cpu", "a * b + c");
  m.def("muladd", &muladd<double>, py::arg("a"), py::arg("b"), py::arg("c"),
        py::arg("device") = "cpu");
  m.def("mul", &mul<float>, py::arg("a"), py::arg("b"), py::arg("device") = "cpu", "a * b");
  m.def("mul", &mul<double>, py::arg("a"), py::arg("b"), py::arg("device") = "cpu");
  m.attr("with_cuda") =
#ifdef WB_WITH_CUDA
      true;
#else
      false;
#endif
}
