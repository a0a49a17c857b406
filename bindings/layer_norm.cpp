// bindings/layer_norm.cpp: host side of the layer_norm family (schemas, checks, allocation,
// dispatch).
//
//   layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor y, Tensor mean,
//       Tensor rstd): normalization over the last dimension (formulas in
//       kernels/layer_norm/layer_norm.h)
//   layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd, Tensor weight)
//       -> (Tensor dx, Tensor dweight, Tensor dbias)
// x, grad: [..., hidden] with hidden >= 1, any strides (made contiguous here); weight, bias:
// [hidden] of x's dtype; mean, rstd: x.shape[:-1], float32 for float32/float16/bfloat16 inputs
// and float64 for float64 (the accumulation type, as torch.native_layer_norm); eps >= 0. Outputs
// are contiguous. The backward's workspace is [2][partials][hidden] of that type (layer_norm.h;
// on CUDA with room for a counter after it: BackwardPlan::workspace elements).
//
// layer_norm's autograd kernel is C++ (WB_AUTOGRAD, at the end): y is differentiated through
// the family's layer_norm_backward op, whose own autograd formula (spec.py) is the double
// backward; mean and rstd are statistics and are not differentiable.
#include "layer_norm/layer_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <tuple>

#include "wb/autograd.h"
#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF(
    "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> "
    "(Tensor y, Tensor mean, Tensor rstd)");
WB_DEF(
    "layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd, Tensor weight) -> "
    "(Tensor dx, Tensor dweight, Tensor dbias)");

namespace {

using namespace wb::layer_norm;
using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
// The C++ signatures of the two ops, as their kernels have them.
using LayerNormFn = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
using LayerNormBackwardFn = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&);

// The accumulation type of x's dtype: the dtype of mean, rstd and the workspace.
c10::ScalarType acc_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The number of rows: the product of every dimension but the last.
int64_t rows_of(const at::Tensor& x) {
  return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
}

void check_x(const char* op, const char* name, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, op, ": expected ", name,
              " to have at least 1 dimension [..., hidden], got a 0-d tensor");
  TORCH_CHECK(x.size(-1) >= 1, op, ": expected ", name,
              ".size(-1) >= 1 (a row to normalize), got shape ", x.sizes());
  TORCH_CHECK(x.size(-1) <= INT32_MAX, op, ": expected ", name, ".size(-1) < 2^31, got ",
              x.size(-1));
}

// A [hidden] parameter of x's dtype and device.
void check_param(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  TORCH_CHECK(t.dim() == 1, op, ": expected ", name, " to be 1-d [hidden], got shape ", t.sizes());
  TORCH_CHECK(t.size(0) == x.size(-1), op, ": expected ", name, ".size(0) (", t.size(0),
              ") to equal x.size(-1) (", x.size(-1), ")");
  wb::check_same_dtype(op, "x", x, name, t);
  wb::check_device(op, name, t, x.device());
}

// mean or rstd of layer_norm_backward: x.shape[:-1] of the accumulation type, on x's device.
void check_stat(const char* name, const at::Tensor& t, const at::Tensor& x) {
  const auto expected = x.sizes().slice(0, x.dim() - 1);
  TORCH_CHECK(t.sizes() == expected, "layer_norm_backward: expected ", name,
              " to have shape x.shape[:-1] ", expected, ", got ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == acc_type(x), "layer_norm_backward: expected ", name,
                   " to have dtype ", acc_type(x), " (the accumulation type of x's ",
                   x.scalar_type(), "), got ", t.scalar_type());
  wb::check_device("layer_norm_backward", name, t, x.device());
}

Triple check_and_allocate(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          double eps) {
  check_x("layer_norm", "x", x);
  check_param("layer_norm", "weight", weight, x);
  check_param("layer_norm", "bias", bias, x);
  TORCH_CHECK(eps >= 0, "layer_norm: expected eps >= 0, got ", eps);
  const auto stats = x.sizes().slice(0, x.dim() - 1);
  return {at::empty(x.sizes(), x.options()), at::empty(stats, x.options().dtype(acc_type(x))),
          at::empty(stats, x.options().dtype(acc_type(x)))};
}

void check_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                    const at::Tensor& rstd, const at::Tensor& weight) {
  check_x("layer_norm_backward", "x", x);
  wb::check_same_shape("layer_norm_backward", "x", x, "grad", grad);
  wb::check_same_dtype("layer_norm_backward", "x", x, "grad", grad);
  wb::check_device("layer_norm_backward", "grad", grad, x.device());
  check_stat("mean", mean, x);
  check_stat("rstd", rstd, x);
  check_param("layer_norm_backward", "weight", weight, x);
}

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

Triple layer_norm_cpu_op(const at::Tensor& x_in, const at::Tensor& weight_in,
                         const at::Tensor& bias_in, double eps) {
  auto [y, mean, rstd] = check_and_allocate(x_in, weight_in, bias_in, eps);
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous(),
                   bias = bias_in.contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t grain = std::max<int64_t>(1, kGrain / hidden);  // rows
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "layer_norm", "x", [&] {
    using A = wb::acc_t<scalar_t>;
    at::parallel_for(0, rows_of(x), grain, [&](int64_t begin, int64_t end) {
      layer_norm_cpu(wb::data<scalar_t>(x), wb::data<scalar_t>(weight), wb::data<scalar_t>(bias),
                     eps, wb::data<scalar_t>(y), wb::data<A>(mean), wb::data<A>(rstd), hidden,
                     begin, end);
    });
  });
  return {y, mean, rstd};
}

Triple layer_norm_backward_cpu_op(const at::Tensor& grad_in, const at::Tensor& x_in,
                                  const at::Tensor& mean_in, const at::Tensor& rstd_in,
                                  const at::Tensor& weight_in) {
  check_backward(grad_in, x_in, mean_in, rstd_in, weight_in);
  const at::Tensor grad = grad_in.contiguous(), x = x_in.contiguous(), mean = mean_in.contiguous(),
                   rstd = rstd_in.contiguous(), weight = weight_in.contiguous();
  const int64_t rows = rows_of(x), hidden = x.size(-1);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dweight = at::empty({hidden}, x.options()), dbias = at::empty({hidden}, x.options());
  const int64_t per_part = cpu_rows_per_partition(rows);
  const int64_t partials = (rows + per_part - 1) / per_part;
  at::Tensor workspace = at::empty({2, partials, hidden}, x.options().dtype(acc_type(x)));
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "layer_norm_backward", "x", [&] {
    using A = wb::acc_t<scalar_t>;
    // One task per partition at most: the partitions, not the tasks, fix the order of the sums.
    at::parallel_for(0, partials, 1, [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part) {
        layer_norm_backward_cpu(wb::data<scalar_t>(grad), wb::data<scalar_t>(x), wb::data<A>(mean),
                                wb::data<A>(rstd), wb::data<scalar_t>(weight),
                                wb::data<scalar_t>(dx), wb::data<A>(workspace), partials, part,
                                hidden, part * per_part, std::min(rows, (part + 1) * per_part));
      }
    });
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(partials, 1));
    at::parallel_for(0, hidden, grain, [&](int64_t begin, int64_t end) {
      layer_norm_backward_sum_cpu(wb::data<A>(workspace), partials, wb::data<scalar_t>(dweight),
                                  wb::data<scalar_t>(dbias), hidden, begin, end);
    });
  });
  return {dx, dweight, dbias};
}

}  // namespace

WB_IMPL(CPU, m) {
  m.impl("layer_norm", &layer_norm_cpu_op);
  m.impl("layer_norm_backward", &layer_norm_backward_cpu_op);
}

#ifdef WB_WITH_CUDA
namespace {

Triple layer_norm_cuda_op(const at::Tensor& x_in, const at::Tensor& weight_in,
                          const at::Tensor& bias_in, double eps) {
  auto [y, mean, rstd] = check_and_allocate(x_in, weight_in, bias_in, eps);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous(),
                   bias = bias_in.contiguous();
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "layer_norm", "x", [&] {
    using A = wb::acc_t<scalar_t>;
    wb::check_launch(
        "layer_norm",
        layer_norm_cuda(wb::data<scalar_t>(x), wb::data<scalar_t>(weight), wb::data<scalar_t>(bias),
                        eps, wb::data<scalar_t>(y), wb::data<A>(mean), wb::data<A>(rstd),
                        rows_of(x), x.size(-1), wb::current_stream(x)));
  });
  return {y, mean, rstd};
}

Triple layer_norm_backward_cuda_op(const at::Tensor& grad_in, const at::Tensor& x_in,
                                   const at::Tensor& mean_in, const at::Tensor& rstd_in,
                                   const at::Tensor& weight_in) {
  check_backward(grad_in, x_in, mean_in, rstd_in, weight_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor grad = grad_in.contiguous(), x = x_in.contiguous(), mean = mean_in.contiguous(),
                   rstd = rstd_in.contiguous(), weight = weight_in.contiguous();
  const int64_t rows = rows_of(x), hidden = x.size(-1);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  if (rows == 0) {  // no rows: the sums over rows are zeros
    return {dx, at::zeros({hidden}, x.options()), at::zeros({hidden}, x.options())};
  }
  at::Tensor dweight = at::empty({hidden}, x.options()), dbias = at::empty({hidden}, x.options());
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "layer_norm_backward", "x", [&] {
    using A = wb::acc_t<scalar_t>;
    const auto* g = wb::data<scalar_t>(grad);
    const auto* xp = wb::data<scalar_t>(x);
    const auto* w = wb::data<scalar_t>(weight);
    auto* dxp = wb::data<scalar_t>(dx);
    const BackwardPlan plan = plan_backward_cuda(g, xp, w, dxp, rows, hidden);
    // Uninitialized: every block writes its partials before any are read.
    at::Tensor workspace = at::empty({plan.workspace}, x.options().dtype(acc_type(x)));
    wb::check_launch(
        "layer_norm_backward",
        layer_norm_backward_cuda(plan, g, xp, wb::data<A>(mean), wb::data<A>(rstd), w, dxp,
                                 wb::data<scalar_t>(dweight), wb::data<scalar_t>(dbias),
                                 wb::data<A>(workspace), rows, hidden, wb::current_stream(x)));
  });
  return {dx, dweight, dbias};
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("layer_norm", &layer_norm_cuda_op);
  m.impl("layer_norm_backward", &layer_norm_backward_cuda_op);
}
#endif

// ---- autograd -------------------------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// mean and rstd of x's rows in the accumulation type, by differentiable ATen ops.
std::tuple<at::Tensor, at::Tensor> differentiable_stats(const at::Tensor& x, double eps) {
  const at::Tensor xf = x.to(acc_type(x));
  const at::Tensor mean = xf.mean(-1);
  const at::Tensor var = xf.sub(mean.unsqueeze(-1)).square().mean(-1);
  return {mean, var.add(eps).rsqrt()};
}

// (y, mean, rstd) = layer_norm(x, weight, bias, eps); the gradients of x, weight and bias from
// y's through layer_norm_backward. ops: the namespace this library serves (wb/autograd.h).
struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, const wb::Ops& ops) {
    at::AutoDispatchBelowADInplaceOrView below;  // the op's own kernels, not this one again
    auto [y, mean, rstd] = ops.op<LayerNormFn>("layer_norm").call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["ns"] = ops.ns();
    ctx->mark_non_differentiable({mean, rstd});
    // mean and rstd never have a gradient: left undefined, not made tensors of zeros (two
    // allocations and two fill kernels in every backward).
    ctx->set_materialize_grads(false);
    return {y, mean, rstd};
  }

  // One gradient per forward argument (x, weight, bias, eps, ops); undefined where not needed.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool want[3] = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                          ctx->needs_input_grad(2)};
    variable_list out(5);
    if (!grads[0].defined() || (!want[0] && !want[1] && !want[2])) return out;  // no dy: none
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const wb::Ops ops(ctx->saved_data["ns"].toStringRef());
    const auto backward_op = ops.op<LayerNormBackwardFn>("layer_norm_backward");
    Triple d;
    if (c10::GradMode::is_enabled()) {
      // This backward is itself differentiated (create_graph): the saved mean and rstd carry no
      // dependence on x, so they are recomputed from x, and layer_norm_backward's own autograd
      // formula differentiates the rest.
      const auto [mean, rstd] = differentiable_stats(x, ctx->saved_data["eps"].toDouble());
      d = backward_op.call(grads[0], x, mean, rstd, weight);
    } else {
      at::AutoDispatchBelowADInplaceOrView below;  // nothing to record: straight to the kernel
      d = backward_op.call(grads[0], x, saved[2], saved[3], weight);
    }
    if (want[0]) out[0] = std::get<0>(d);
    if (want[1]) out[1] = std::get<1>(d);
    if (want[2]) out[2] = std::get<2>(d);
    return out;
  }
};

Triple layer_norm_autograd(const wb::Ops& ops, const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias, double eps) {
  const variable_list out = LayerNormFunction::apply(x, weight, bias, eps, ops);
  return {out[0], out[1], out[2]};
}

}  // namespace

WB_AUTOGRAD("layer_norm", &layer_norm_autograd);
