// deferred.cpp: the registration entry points of a drop-in library (see wb_compat.h).
//
// Linked into every library built by workbench.load() / load_inline() whose sources use
// TORCH_LIBRARY or STABLE_TORCH_LIBRARY (wb_compat_stable.h, through defer_opaque).
// wbc_register() makes the recorded blocks' registrations (definitions first, then fragments,
// then kernels) and returns 0, or 1 with the error text; wbc_unregister() removes them again.
// Errors never escape as C++ exceptions, so a bad build cannot abort.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "wb_compat.h"
#include "wb_defer.h"

#define WBC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Entry {
  int rank;  // 0 a definition, 1 a fragment, 2 kernels
  const char* ns;
  // A TORCH_LIBRARY* block: its torch::Library and init function.
  torch::Library::Kind kind;
  wb::compat::InitFn fn;
  std::optional<c10::DispatchKey> key;
  const char* file;
  uint32_t line;
  // Any other block (STABLE_TORCH_LIBRARY*): made and dropped by these.
  wb::compat::OpaqueMake make = nullptr;
  wb::compat::OpaqueDrop drop = nullptr;
  const void* block = nullptr;
};

std::vector<Entry>& entries() {
  static std::vector<Entry> list;
  return list;
}

// The registrations made, each a library object of its block's type and its deleter.
std::vector<std::shared_ptr<void>>& live() {
  static std::vector<std::shared_ptr<void>> libs;
  return libs;
}

int rank(torch::Library::Kind kind) {
  return kind == torch::Library::DEF ? 0 : kind == torch::Library::FRAGMENT ? 1 : 2;
}

void write_error(const std::string& message, char* buf, size_t size) {
  if (buf == nullptr || size == 0) return;
  std::strncpy(buf, message.c_str(), size - 1);
  buf[size - 1] = '\0';
}

void clear() {
  while (!live().empty()) live().pop_back();  // newest first: kernels before definitions
}

}  // namespace

wb::compat::Deferred::Deferred(torch::Library::Kind kind, InitFn fn, const char* ns,
                               std::optional<c10::DispatchKey> key, const char* file,
                               uint32_t line) {
  entries().push_back({rank(kind), ns, kind, fn, key, file, line});
}

void wb::compat::defer_opaque(int rank, const char* ns, OpaqueMake make, OpaqueDrop drop,
                              const void* block) {
  entries().push_back(
      {rank, ns, torch::Library::FRAGMENT, nullptr, std::nullopt, "", 0, make, drop, block});
}

// Bumped when the meaning of these entry points changes.
WBC_EXPORT int wbc_abi_version() { return 1; }

WBC_EXPORT int wbc_block_count() { return static_cast<int>(entries().size()); }

// The namespace of recorded block i (nullptr out of range).
WBC_EXPORT const char* wbc_block_namespace(int i) {
  return i >= 0 && i < wbc_block_count() ? entries()[i].ns : nullptr;
}

WBC_EXPORT int wbc_register(char* err, size_t err_size) {
  if (!live().empty()) {
    write_error("this library is already registered", err, err_size);
    return 1;
  }
  std::vector<Entry> ordered = entries();
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const Entry& a, const Entry& b) { return a.rank < b.rank; });
  try {
    for (const Entry& e : ordered) {
      if (e.make != nullptr) {
        live().emplace_back(e.make(e.block), e.drop);
        continue;
      }
      auto lib = std::make_shared<torch::Library>(e.kind, e.ns, e.key, e.file, e.line);
      live().push_back(lib);
      e.fn(*lib);
    }
    return 0;
  } catch (const c10::Error& e) {
    write_error(e.what_without_backtrace(), err, err_size);
  } catch (const std::exception& e) {
    write_error(e.what(), err, err_size);
  }
  clear();
  return 1;
}

WBC_EXPORT void wbc_unregister() { clear(); }
