// wb/autograd.h: an op's autograd kernel written in C++, for host TUs under bindings/.
//
//   Triple layer_norm_autograd(const wb::Ops& ops, const at::Tensor& x, ...);  // op's arguments
//   WB_AUTOGRAD("layer_norm", &layer_norm_autograd);
//
// The function becomes the op's kernel for dispatch key Autograd when the library registers
// (wb_register), and the driver reads the op's name (wb_describe): the
// op's spec then declares `cpp_autograd=True` and no Python `backward`. It runs only when a graph
// may be recorded (grad mode on and a tensor argument that requires grad); every other call goes
// below autograd to the op's own kernels without calling it, and no Python runs either way.
//
// `ops` names the namespace the library is registered under, chosen at load time (one library
// may be registered under several: tuned variants, routers); `ops.op<Sig>("name")` is that
// namespace's op. A torch::autograd::Function's forward calls the op below autograd
// (at::AutoDispatchBelowADInplaceOrView), and its backward finds the ops again from the
// namespace it saved (`ctx->saved_data["ns"] = ops.ns()`): a graph may outlive the registration.
//
// A library whose autograd kernel recorded a graph is never unmapped (wb_autograd_recorded):
// the graph's nodes run its code, in backward or when they are destroyed, after any reload.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>

#include "wb/binding.h"

namespace wb {

// The ops of the namespace an autograd kernel is registered under.
class Ops {
 public:
  explicit Ops(std::string ns) : ns_(std::move(ns)) {}
  const std::string& ns() const { return ns_; }

  // ns::name, typed with its C++ signature (e.g. decltype(layer_norm_cpu_op)); raises if no such
  // op is defined. Looked up at each call: cheap, and never stale after a reload.
  template <typename Sig>
  c10::TypedOperatorHandle<Sig> op(const char* name) const {
    auto handle = c10::Dispatcher::singleton().findOp({ns_ + "::" + name, ""});
    TORCH_CHECK(handle.has_value(), "no op ", ns_, "::", name, " is defined");
    return handle->template typed<Sig>();
  }

 private:
  std::string ns_;
};

namespace detail {

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}
inline bool requires_grad(at::TensorList ts) {
  for (const auto& t : ts) {
    if (requires_grad(t)) return true;
  }
  return false;
}
template <typename T>
bool requires_grad(const T&) {
  return false;
}

void note_autograd_recorded();  // registry.cpp: wb_autograd_recorded() answers 1 from now on

using AutogradInstall = void (*)(torch::Library&, const char* op, const std::string& ns);
void add_autograd(const char* op, AutogradInstall install, const char* file, uint32_t line);

template <auto Fn, typename F = decltype(Fn)>
struct AutogradKernel;

template <auto Fn, typename R, typename... Args>
struct AutogradKernel<Fn, R (*)(const Ops&, Args...)> {
  // Registers Fn, bound to namespace ns, as op's Autograd kernel on m (an Autograd library).
  static void install(torch::Library& m, const char* op, const std::string& ns) {
    Ops ops(ns);
    // ns::op stays defined while this kernel is registered (a registration keeps its op).
    auto self = ops.op<R(Args...)>(op);
    m.impl(op, [ops = std::move(ops), self](c10::DispatchKeySet keys, Args... args) -> R {
      if (c10::GradMode::is_enabled() && (requires_grad(args) || ...)) {
        note_autograd_recorded();
        return Fn(ops, std::forward<Args>(args)...);
      }
      at::AutoDispatchBelowAutograd below;  // no graph to record: the op's own kernels
      return self.redispatch(keys & c10::after_autograd_keyset, std::forward<Args>(args)...);
    });
  }
};

struct AutogradRegistrar {
  AutogradRegistrar(const char* op, AutogradInstall install, const char* file, uint32_t line) {
    add_autograd(op, install, file, line);
  }
};

}  // namespace detail
}  // namespace wb

// Makes FN (`R FN(const wb::Ops&, <the op's arguments>)`) op OP's Autograd kernel.
#define WB_AUTOGRAD(OP, FN)                                                    \
  static ::wb::detail::AutogradRegistrar WB_CONCAT(wb_autograd_, __COUNTER__)( \
      OP, &::wb::detail::AutogradKernel<FN>::install, __FILE__, __LINE__)
