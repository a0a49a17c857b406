// wb_compat_stable.h: deferred STABLE_TORCH_LIBRARY registration for drop-in sources.
//
// Force-included (-include) ahead of every drop-in source that names STABLE_TORCH_LIBRARY (the
// LibTorch stable ABI, <torch/csrc/stable/library.h>), as wb_compat.h is for TORCH_LIBRARY:
// opening the library records each block, wbc_register() makes it, wbc_unregister() drops it,
// so an edited build can be swapped in where a second registration at dlopen would fail.
#pragma once

#include <torch/csrc/stable/library.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "wb_defer.h"

// StableLibrary is torch::stable::detail::StableLibrary in newer torch and ::StableLibrary in
// older: an unqualified lookup through the using-directive finds whichever this torch has.
namespace torch::stable::detail {}
namespace wb::compat::lookup {
using namespace torch::stable::detail;
using Library = StableLibrary;
}  // namespace wb::compat::lookup

namespace wb::compat {

using StableLibrary = lookup::Library;

struct StableBlock {
  StableLibrary::Kind kind;
  void (*fn)(StableLibrary&);
  const char* ns;
  const char* key;  // the dispatch key of an IMPL block, else nullptr
  const char* file;
  uint32_t line;
};

// StableLibrary ignores a failed init (the namespace defined twice) and then registers through
// a handle never set: try the init first, and throw its failure instead.
inline void check_init(const StableBlock& b) {
  TorchLibraryHandle probe = nullptr;
  AOTITorchError err = b.kind == StableLibrary::Kind::DEF
                           ? aoti_torch_library_init_def(b.ns, b.file, b.line, &probe)
                       : b.kind == StableLibrary::Kind::FRAGMENT
                           ? aoti_torch_library_init_fragment(b.ns, b.file, b.line, &probe)
                           : aoti_torch_library_init_impl(b.ns, b.key, b.file, b.line, &probe);
  if (err != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error(std::string("STABLE_TORCH_LIBRARY block for namespace ") + b.ns +
                             " at " + b.file + ":" + std::to_string(b.line) +
                             " could not be registered (see the message above; a namespace "
                             "defined by two libraries?)");
  }
  aoti_torch_delete_library_object(probe);
}

inline void* make_stable(const void* block) {
  const auto& b = *static_cast<const StableBlock*>(block);
  check_init(b);
  auto* lib = new StableLibrary(b.kind, b.ns, b.key, b.file, b.line);
  try {
    b.fn(*lib);
  } catch (...) {
    delete lib;
    throw;
  }
  return lib;
}

inline void drop_stable(void* library) { delete static_cast<StableLibrary*>(library); }

struct StableDeferred {
  explicit StableDeferred(const StableBlock* b) {
    const int rank = b->kind == StableLibrary::Kind::DEF        ? 0
                     : b->kind == StableLibrary::Kind::FRAGMENT ? 1
                                                                : 2;
    defer_opaque(rank, b->ns, &make_stable, &drop_stable, b);
  }
};

}  // namespace wb::compat

#undef STABLE_TORCH_LIBRARY
#define STABLE_TORCH_LIBRARY(ns, m)                                                \
  static void STABLE_TORCH_LIBRARY_init_##ns(::wb::compat::StableLibrary&);        \
  static const ::wb::compat::StableBlock STABLE_TORCH_LIBRARY_block_##ns{          \
      ::wb::compat::StableLibrary::Kind::DEF,                                      \
      &STABLE_TORCH_LIBRARY_init_##ns,                                             \
      C10_STRINGIZE(ns),                                                           \
      nullptr,                                                                     \
      __FILE__,                                                                    \
      __LINE__};                                                                   \
  static const ::wb::compat::StableDeferred STABLE_TORCH_LIBRARY_static_init_##ns( \
      &STABLE_TORCH_LIBRARY_block_##ns);                                           \
  void STABLE_TORCH_LIBRARY_init_##ns(::wb::compat::StableLibrary& m)

#undef _STABLE_TORCH_LIBRARY_FRAGMENT
#define _STABLE_TORCH_LIBRARY_FRAGMENT(ns, m, uid)                              \
  static void C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_init_##ns##_,       \
                              uid)(::wb::compat::StableLibrary&);               \
  static const ::wb::compat::StableBlock C10_CONCATENATE(                       \
      STABLE_TORCH_LIBRARY_FRAGMENT_block_##ns##_, uid){                        \
      ::wb::compat::StableLibrary::Kind::FRAGMENT,                              \
      &C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid),        \
      C10_STRINGIZE(ns),                                                        \
      nullptr,                                                                  \
      __FILE__,                                                                 \
      __LINE__};                                                                \
  static const ::wb::compat::StableDeferred C10_CONCATENATE(                    \
      STABLE_TORCH_LIBRARY_FRAGMENT_static_init_##ns##_,                        \
      uid)(&C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_block_##ns##_, uid)); \
  void C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_init_##ns##_,              \
                       uid)(::wb::compat::StableLibrary & m)

#undef _STABLE_TORCH_LIBRARY_IMPL
#define _STABLE_TORCH_LIBRARY_IMPL(ns, k, m, uid)                                 \
  static void C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_init_##ns##_##k##_,       \
                              uid)(::wb::compat::StableLibrary&);                 \
  static const ::wb::compat::StableBlock C10_CONCATENATE(                         \
      STABLE_TORCH_LIBRARY_IMPL_block_##ns##_##k##_, uid){                        \
      ::wb::compat::StableLibrary::Kind::IMPL,                                    \
      &C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid),        \
      C10_STRINGIZE(ns),                                                          \
      C10_STRINGIZE(k),                                                           \
      __FILE__,                                                                   \
      __LINE__};                                                                  \
  static const ::wb::compat::StableDeferred C10_CONCATENATE(                      \
      STABLE_TORCH_LIBRARY_IMPL_static_init_##ns##_##k##_,                        \
      uid)(&C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_block_##ns##_##k##_, uid)); \
  void C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_init_##ns##_##k##_,              \
                       uid)(::wb::compat::StableLibrary & m)
