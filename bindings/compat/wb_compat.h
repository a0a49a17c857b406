// wb_compat.h: deferred TORCH_LIBRARY registration for sources loaded with workbench.load().
//
// Force-included (-include) ahead of every drop-in source that mentions TORCH_LIBRARY. It
// includes <torch/library.h> first, then redefines TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT and
// TORCH_LIBRARY_IMPL so that opening the library records each block instead of registering it.
// The driver then calls wbc_register() (bindings/compat/deferred.cpp), and on reload opens the
// edited build first, calls wbc_unregister() on the old one and wbc_register() on the new one.
// Loading a second library that registers TORCH_LIBRARY(ns) at dlopen would abort the process;
// a deferred registration that fails comes back as an error message instead.
#pragma once

#include <torch/library.h>

#include <cstdint>
#include <optional>

namespace wb::compat {

using InitFn = void (*)(torch::Library&);

// Records one TORCH_LIBRARY* block of this library; registers nothing.
struct __attribute__((visibility("hidden"))) Deferred {
  Deferred(torch::Library::Kind kind, InitFn fn, const char* ns,
           std::optional<c10::DispatchKey> key, const char* file, uint32_t line);
};

}  // namespace wb::compat

#undef TORCH_LIBRARY
#define TORCH_LIBRARY(ns, m)                                                                    \
  static void TORCH_LIBRARY_init_##ns(torch::Library&);                                         \
  static const ::wb::compat::Deferred TORCH_LIBRARY_static_init_##ns(                           \
      torch::Library::DEF, &TORCH_LIBRARY_init_##ns, C10_STRINGIZE(ns), std::nullopt, __FILE__, \
      __LINE__);                                                                                \
  void TORCH_LIBRARY_init_##ns(torch::Library& m)

#undef _TORCH_LIBRARY_FRAGMENT
#define _TORCH_LIBRARY_FRAGMENT(ns, m, uid)                                                       \
  static void C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid)(torch::Library&);         \
  static const ::wb::compat::Deferred C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_static_init_##ns##_, \
                                                      uid)(                                       \
      torch::Library::FRAGMENT, &C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid),       \
      C10_STRINGIZE(ns), std::nullopt, __FILE__, __LINE__);                                       \
  void C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid)(torch::Library & m)

#undef _TORCH_LIBRARY_IMPL
#define _TORCH_LIBRARY_IMPL(ns, k, m, uid)                                                  \
  static void C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid)(torch::Library&); \
  static const ::wb::compat::Deferred C10_CONCATENATE(                                      \
      TORCH_LIBRARY_IMPL_static_init_##ns##_##k##_, uid)(                                   \
      torch::Library::IMPL, &C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid),   \
      C10_STRINGIZE(ns), std::make_optional(c10::DispatchKey::k), __FILE__, __LINE__);      \
  void C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid)(torch::Library & m)
