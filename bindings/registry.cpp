// registry.cpp: the entry points of every library the workbench builds (one copy per library).
//
// The driver opens a library with RTLD_LOCAL, reads its schemas, defines them from Python, and
// calls wb_register(ns). Errors are returned as text instead of escaping as C++ exceptions, so a
// bad build is reported and never aborts the process. wb_unregister(ns) removes this library's
// kernels under ns from the dispatcher; the driver calls it before dlclose on reload.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "wb/binding.h"

#define WB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct ImplEntry {
  c10::DispatchKey key;
  wb::detail::ImplFn fn;
  const char* file;
  uint32_t line;
};

std::vector<const char*>& schemas() {
  static std::vector<const char*> list;
  return list;
}
std::vector<ImplEntry>& impls() {
  static std::vector<ImplEntry> list;
  return list;
}
// The registrations made under each namespace. dlopen returns the same handle for the same
// file, so one library can be live under several namespaces at once.
using Registrations = std::vector<std::unique_ptr<torch::Library>>;
std::map<std::string, Registrations>& live() {
  static std::map<std::string, Registrations> by_namespace;
  return by_namespace;
}

void write_error(const std::string& message, char* buf, size_t size) {
  if (buf == nullptr || size == 0) return;
  std::strncpy(buf, message.c_str(), size - 1);
  buf[size - 1] = '\0';
}

}  // namespace

namespace wb::detail {
void add_schema(const char* schema) { schemas().push_back(schema); }
void add_impl(c10::DispatchKey key, ImplFn fn, const char* file, uint32_t line) {
  impls().push_back({key, fn, file, line});
}
}  // namespace wb::detail

// Bumped when the meaning of these entry points changes; the driver refuses other versions.
WB_EXPORT int wb_abi_version() { return 2; }

WB_EXPORT int wb_schema_count() { return static_cast<int>(schemas().size()); }

WB_EXPORT const char* wb_schema(int i) {
  return i >= 0 && i < wb_schema_count() ? schemas()[i] : nullptr;
}

// Registers this library's kernels under namespace ns. Returns 0, or 1 with the error in err.
WB_EXPORT int wb_register(const char* ns, char* err, size_t err_size) {
  Registrations regs;
  try {
    TORCH_CHECK(live().count(ns) == 0, "already registered under namespace ", ns);
    for (const auto& e : impls()) {
      regs.push_back(
          std::make_unique<torch::Library>(torch::Library::IMPL, ns, e.key, e.file, e.line));
      e.fn(*regs.back());
    }
    live()[ns] = std::move(regs);
    return 0;
  } catch (const c10::Error& e) {
    write_error(e.what_without_backtrace(), err, err_size);
  } catch (const std::exception& e) {
    write_error(e.what(), err, err_size);
  }
  return 1;  // regs goes out of scope: whatever was registered is removed again
}

WB_EXPORT void wb_unregister(const char* ns) { live().erase(ns); }
