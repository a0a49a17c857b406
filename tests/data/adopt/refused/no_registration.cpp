// A source with no registration: nothing says which functions are ops.
#include <torch/extension.h>

at::Tensor twice(const at::Tensor& x) { return x * 2; }
