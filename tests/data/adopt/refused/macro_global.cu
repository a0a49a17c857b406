// A kernel that a macro defines: adopt cannot see it to move it.
#include <torch/extension.h>

#define DEFINE_FILL(name, value) \
  __global__ void name(float* out, int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x; \
    if (i < n) out[i] = value; \
  }

DEFINE_FILL(fill_one, 1.0f)

at::Tensor ones_cuda(const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  fill_one<<<(x.numel() + 127) / 128, 128>>>(out.data_ptr<float>(), x.numel());
  return out;
}

TORCH_LIBRARY(macro_ext, m) { m.def("ones(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(macro_ext, CUDA, m) { m.impl("ones", &ones_cuda); }
