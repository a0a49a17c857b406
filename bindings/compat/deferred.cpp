// deferred.cpp: the registration entry points of a drop-in library (see wb_compat.h).
//
// Linked into every library built by workbench.load() / load_inline() whose sources use
// TORCH_LIBRARY. wbc_register() makes the recorded blocks' registrations (definitions first,
// then fragments, then kernels) and returns 0, or 1 with the error text; wbc_unregister()
// removes them again. Errors never escape as C++ exceptions, so a bad build cannot abort.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "wb_compat.h"

#define WBC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Entry {
  torch::Library::Kind kind;
  wb::compat::InitFn fn;
  const char* ns;
  std::optional<c10::DispatchKey> key;
  const char* file;
  uint32_t line;
};

std::vector<Entry>& entries() {
  static std::vector<Entry> list;
  return list;
}

std::vector<std::unique_ptr<torch::Library>>& live() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
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
  entries().push_back({kind, fn, ns, key, file, line});
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
                   [](const Entry& a, const Entry& b) { return rank(a.kind) < rank(b.kind); });
  try {
    for (const Entry& e : ordered) {
      live().push_back(std::make_unique<torch::Library>(e.kind, e.ns, e.key, e.file, e.line));
      e.fn(*live().back());
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
