// A CUDA-only extension in the older split: the schema and the registration here, the kernel
// and its host function in ops.cu (declared below).
#include <torch/extension.h>

namespace split_ext {

at::Tensor square_cuda(const at::Tensor& x);

TORCH_LIBRARY(split_ext, m) {
  m.def("square(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(split_ext, CUDA, m) {
  m.impl("square", &square_cuda);
}

}  // namespace split_ext
