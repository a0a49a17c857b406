// registry.cpp: the entry points of every library the workbench builds (one copy per library).
//
// The driver opens a library with RTLD_LOCAL, reads its schemas (wb_describe), defines them
// from Python, and calls wb_register(ns). Errors are returned as text instead of escaping as C++
// exceptions, so a bad build is reported and never aborts the process. wb_unregister(ns) removes
// this library's kernels under ns from the dispatcher; the driver calls it before dlclose on
// reload.
//
// wb_kernel_count / wb_kernel_name list the kernels that host launchers name in device-only TUs
// (wb/module.h), wb_kernel_used says which of them this process has launched; wb_module_load
// hands over their cubins and wb_module_hook asks the driver for a kernel its module lacks
// (wb/registry_modules.h).
//
// WB_AUTOGRAD kernels (wb/autograd.h) are registered by wb_register under dispatch key Autograd,
// after the other kernels; wb_describe lists their ops, so the driver registers no Python
// autograd formula for them. wb_register_autograd(ns) registers them alone
// (the public namespace of a routed family, whose other kernels are routers), and
// wb_autograd_recorded() says whether one has recorded a graph: its nodes run this library's
// code for as long as the graph lives, so the driver never unmaps such a library.
//
// wb_register also puts a C++ kernel at dispatch key Autograd (a gate) in front of each of its ops
// whose formula is Python (the driver registers that formula's kernel on the op, and again on
// its twin ns::_wb_autograd_<op>): a call in which no argument needs a gradient goes below autograd
// in C++, as torch's kernel would send it, and only a call that needs one enters Python, through
// the twin. wb_autograd_gate(ns) makes them again after the driver redefined twins. Removed by
// wb_unregister(ns); the Python kernel on the op serves again until a gate is.
//
// wb_route(ns, op, key, ...) registers a router for a tuned op (workbench/tuning/route.py): the
// family's builds are registered under private namespaces, and ns::op sends each call to the
// variant chosen for its first tensor argument's (device, dtype, numel bucket) by redispatching
// straight to that namespace's kernel for the same dispatch key. No Python runs in the call.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "wb/autograd.h"
#include "wb/binding.h"
#include "wb/registry_modules.h"

#ifdef WB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

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

struct AutogradEntry {
  const char* op;
  wb::detail::AutogradInstall install;
  const char* file;
  uint32_t line;
};

std::vector<AutogradEntry>& autograds() {
  static std::vector<AutogradEntry> list;
  return list;
}
std::atomic<bool> autograd_recorded{false};

// Adds this library's autograd kernels under ns to regs.
void register_autograd(const char* ns, Registrations& regs) {
  for (const auto& e : autograds()) {
    regs.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                    c10::DispatchKey::Autograd, e.file, e.line));
    e.install(*regs.back(), e.op, ns);
  }
}

void write_error(const std::string& message, char* buf, size_t size) {
  if (buf == nullptr || size == 0) return;
  std::strncpy(buf, message.c_str(), size - 1);
  buf[size - 1] = '\0';
}

// Runs `body` for an entry point: 0, or 1 with its exception's message in err (an exception
// never crosses into the driver).
template <typename Body>
int guarded(char* err, size_t err_size, Body&& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    write_error(e.what_without_backtrace(), err, err_size);
  } catch (const std::exception& e) {
    write_error(e.what(), err, err_size);
  }
  return 1;
}

// --- the autograd gate of ops with a Python formula -------------------------------------------

// Whether an argument is, or holds, a tensor that requires grad (torch's _any_requires_grad).
bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.requires_grad();
  }
  if (v.isList()) {  // Tensor[] and Tensor?[] alike: their elements are IValues
    for (const c10::IValue& e : v.toListRef()) {
      if (requires_grad(e)) return true;
    }
  }
  return false;
}

// The Autograd kernel of an op whose formula is Python. Without grad mode or an argument that
// requires grad it does what torch's kernel for such an op does then (forward_no_grad in
// torch/_library/autograd.py): dispatch below autograd, here without entering Python. Otherwise
// the twin's Autograd kernel, the same formula's, runs the call at this dispatch level.
class AutogradGate final : public c10::OperatorKernel {
 public:
  explicit AutogradGate(std::string twin) : twin_(std::move(twin)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const size_t nargs = op.schema().arguments().size();
    bool grad = false;
    if (at::GradMode::is_enabled()) {
      for (size_t i = stack->size() - nargs; i < stack->size() && !grad; ++i) {
        grad = requires_grad((*stack)[i]);
      }
    }
    if (!grad) {
      at::AutoDispatchBelowAutograd below;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
      return;
    }
    // Looked up at each such call: a spec edit defines the twin anew.
    const auto twin = c10::Dispatcher::singleton().findOp({twin_, ""});
    TORCH_CHECK(twin.has_value(), op.operator_name().name, ": its autograd formula (", twin_,
                ") is not registered; reload the family");
    twin->redispatchBoxed(keys, stack);
  }

 private:
  std::string twin_;  // "ns::_wb_autograd_op"
};

// The registrations of the gates under each namespace (see wb_autograd_gate).
std::map<std::string, Registrations>& gates() {
  static std::map<std::string, Registrations> by_namespace;
  return by_namespace;
}

// Drops the "Overriding a previously registered kernel" warning that a gate's registration gives
// (it overrides the Python kernel on purpose); any other warning goes to the handler before it.
class QuietOverride final : public c10::WarningHandler {
 public:
  QuietOverride() : previous_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") != std::string::npos) {
      return;
    }
    previous_->process(warning);
  }

 private:
  c10::WarningHandler* previous_;
};

// --- routing tuned ops ------------------------------------------------------------------------

// The name of a CUDA device ("NVIDIA H100 80GB HBM3"), read once per device; "" on a CPU.
const std::string& device_name(const at::Tensor& t) {
  static const std::string none;
#ifdef WB_WITH_CUDA
  if (t.is_cuda()) {
    static std::mutex mutex;
    static std::map<int, std::string> names;  // node addresses are stable: references stay good
    std::lock_guard<std::mutex> lock(mutex);
    const int index = t.device().index();
    auto found = names.find(index);
    if (found != names.end()) return found->second;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
      (void)cudaGetLastError();  // no table matches: the call takes the default build
      return none;
    }
    return names.emplace(index, prop.name).first->second;
  }
#endif
  (void)t;
  return none;
}

// The winners of one (device, dtype): bucket i holds numel in [bounds[i-1], bounds[i]).
struct Table {
  std::string device;     // a CUDA device name; "" matches any device (CPU tables)
  c10::ScalarType dtype;  // of the first tensor argument
  std::vector<int64_t> bounds;
  std::vector<c10::OperatorHandle> targets;  // bounds.size() + 1
};

class Router final : public c10::OperatorKernel {
 public:
  Router(c10::DispatchKey key, size_t arg, c10::OperatorHandle fallback, std::vector<Table> tables)
      : key_(key),
        arg_(arg),
        fallback_(std::move(fallback)),
        tables_(std::move(tables)),
        trace_(std::getenv("WB_ROUTE_TRACE") != nullptr) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t nargs = op.schema().arguments().size();
    const c10::IValue& first = (*stack)[stack->size() - nargs + arg_];
    const c10::OperatorHandle* target = &fallback_;
    if (first.isTensor()) {
      const at::Tensor& t = first.toTensor();
      const c10::ScalarType dtype = t.scalar_type();
      for (const Table& table : tables_) {
        if (table.dtype != dtype) continue;
        if (!table.device.empty() && table.device != device_name(t)) continue;
        const auto bucket = std::upper_bound(table.bounds.begin(), table.bounds.end(), t.numel());
        target = &table.targets[bucket - table.bounds.begin()];
        break;
      }
      if (trace_) {  // WB_ROUTE_TRACE: which build serves each call (for debugging and tests)
        std::fprintf(stderr, "wb route: %s numel=%lld %s -> %s\n", op.operator_name().name.c_str(),
                     static_cast<long long>(t.numel()), c10::toString(t.scalar_type()),
                     target->operator_name().name.c_str());
      }
    }
    target->redispatchBoxed(c10::DispatchKeySet(key_), stack);
  }

 private:
  c10::DispatchKey key_;
  size_t arg_;  // the index of the first tensor argument in the schema
  c10::OperatorHandle fallback_;
  std::vector<Table> tables_;
  bool trace_;
};

c10::OperatorHandle find_op(const std::string& ns, const std::string& op) {
  auto handle = c10::Dispatcher::singleton().findOp({ns + "::" + op, ""});
  TORCH_CHECK(handle.has_value(), "routing: no op ", ns, "::", op, " is defined");
  return *handle;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

// A dtype by its c10 name (c10::toString: "Float", "BFloat16", "Float8_e4m3fn", ...).
c10::ScalarType parse_dtype(const std::string& name, const std::string& op) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (name == c10::toString(type)) return type;
  }
  TORCH_CHECK(false, "routing ", op, ": no dtype named ", name, " in this torch");
}

// One table per line: device \t dtype (its c10 name) \t bounds (comma-separated) \t target
// namespaces.
std::vector<Table> parse_tables(const std::string& text, const std::string& op) {
  std::vector<Table> tables;
  for (const std::string& line : split(text, '\n')) {
    if (line.empty()) continue;
    const auto fields = split(line + "\t", '\t');
    TORCH_CHECK(fields.size() == 4, "routing ", op, ": a table line needs 4 fields: ", line);
    Table table{fields[0], parse_dtype(fields[1], op), {}, {}};
    for (const auto& b : split(fields[2], ',')) table.bounds.push_back(std::stoll(b));
    for (const auto& ns : split(fields[3], ',')) table.targets.push_back(find_op(ns, op));
    TORCH_CHECK(std::is_sorted(table.bounds.begin(), table.bounds.end()), "routing ", op,
                ": bucket bounds must ascend");
    TORCH_CHECK(table.targets.size() == table.bounds.size() + 1, "routing ", op, ": ",
                table.bounds.size(), " bounds need ", table.bounds.size() + 1, " targets");
    tables.push_back(std::move(table));
  }
  return tables;
}

// The gates of this library's ops under ns whose twin ns::_wb_autograd_<op> is defined (the driver
// defines it with the op's Python formula), into regs.
void make_gates(const char* ns, Registrations& regs) {
  QuietOverride quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  for (const char* schema : schemas()) {
    const size_t end = std::strcspn(schema, "(.");
    if (schema[end] != '(') continue;  // an overload name: no twin (runtime.py)
    std::string op(schema, end);
    while (!op.empty() && op.back() == ' ') op.pop_back();
    const std::string twin = std::string(ns) + "::_wb_autograd_" + op;
    if (op.empty() || !c10::Dispatcher::singleton().findOp({twin, ""}).has_value()) continue;
    regs.push_back(std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, c10::DispatchKey::Autograd, __FILE__, __LINE__));
    regs.back()->impl(
        op.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradGate>(twin)));
  }
}

}  // namespace

namespace wb::detail {
void add_schema(const char* schema) { schemas().push_back(schema); }
void add_impl(c10::DispatchKey key, ImplFn fn, const char* file, uint32_t line) {
  impls().push_back({key, fn, file, line});
}
void add_autograd(const char* op, AutogradInstall install, const char* file, uint32_t line) {
  autograds().push_back({op, install, file, line});
}
void note_autograd_recorded() { autograd_recorded.store(true, std::memory_order_relaxed); }
}  // namespace wb::detail

// Bumped when the meaning of these entry points changes; the driver refuses other versions.
WB_EXPORT int wb_abi_version() { return 9; }

// What the driver reads when it opens the library, in one call: lines of the entry-point
// version, then "schema\t" + each schema, then "autograd\t" + each op with a C++ autograd
// kernel (one dlsym and one call per library, where an entry point per list took five and a
// call per schema: a warm start opens every library of the registry). The first line stays the
// version in every later version.
WB_EXPORT const char* wb_describe() {
  static const std::string text = [] {
    std::string out = std::to_string(wb_abi_version()) + "\n";
    for (const char* schema : schemas()) out += std::string("schema\t") + schema + "\n";
    for (const auto& e : autograds()) out += std::string("autograd\t") + e.op + "\n";
    return out;
  }();
  return text.c_str();
}

// Registers this library's kernels under namespace ns. Returns 0, or 1 with the error in err.
WB_EXPORT int wb_register(const char* ns, char* err, size_t err_size) {
  Registrations regs;  // on an error it goes out of scope: whatever was registered is removed
  return guarded(err, err_size, [&] {
    TORCH_CHECK(live().count(ns) == 0, "already registered under namespace ", ns);
    for (const auto& e : impls()) {
      regs.push_back(
          std::make_unique<torch::Library>(torch::Library::IMPL, ns, e.key, e.file, e.line));
      e.fn(*regs.back());
    }
    register_autograd(ns, regs);
    Registrations gated;
    make_gates(ns, gated);
    live()[ns] = std::move(regs);
    gates()[ns] = std::move(gated);
  });
}

WB_EXPORT void wb_unregister(const char* ns) {
  gates().erase(ns);
  live().erase(ns);
}

// Makes the autograd gates of this library's ops under ns again (see make_gates; wb_register
// makes them too): after the driver defined or dropped a twin. Removed by wb_unregister(ns).
// Returns 0, or 1 with the error in err.
WB_EXPORT int wb_autograd_gate(const char* ns, char* err, size_t err_size) {
  Registrations regs;
  return guarded(err, err_size, [&] {
    gates().erase(ns);
    make_gates(ns, regs);
    gates()[ns] = std::move(regs);
  });
}

// Registers only this library's autograd kernels under ns (the public namespace of a routed
// family: its routers redispatch below autograd). Removed by wb_unregister(ns). Returns 0, or 1
// with the error in err.
WB_EXPORT int wb_register_autograd(const char* ns, char* err, size_t err_size) {
  Registrations regs;
  return guarded(err, err_size, [&] {
    register_autograd(ns, regs);
    auto& live_regs = live()[ns];
    for (auto& r : regs) live_regs.push_back(std::move(r));
  });
}

// 1 once one of this library's autograd kernels may have recorded a graph (it ran with grad
// mode on and an argument that requires grad), else 0. Such a library must stay mapped.
WB_EXPORT int wb_autograd_recorded() {
  return autograd_recorded.load(std::memory_order_relaxed) ? 1 : 0;
}

// Registers a router as ns::op's kernel for dispatch key `key`: each call goes to the variant
// its first tensor argument (schema index `arg`) selects in `tables` (see parse_tables), or to
// fallback_ns::op when no table matches. Removed by wb_unregister(ns). Returns 0, or 1 with
// the error in err.
WB_EXPORT int wb_route(const char* ns, const char* op, const char* key, int arg,
                       const char* fallback_ns, const char* tables, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    TORCH_CHECK(arg >= 0, "routing ", op, ": no tensor argument to bucket by");
    auto router = std::make_unique<Router>(c10::parseDispatchKey(key), static_cast<size_t>(arg),
                                           find_op(fallback_ns, op), parse_tables(tables, op));
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                c10::parseDispatchKey(key), __FILE__, __LINE__);
    lib->impl(op, torch::CppFunction::makeFromBoxedFunctor(std::move(router)));
    live()[ns].push_back(std::move(lib));
  });
}

// The kernels host launchers name in device-only TUs, registered while the library loaded:
// kernel i as "file\texpression" (its device-only TU, relative to the family's folder, and its
// name expression), or nullptr.
WB_EXPORT int wb_kernel_count() { return wb::detail::kernel_count(); }
WB_EXPORT const char* wb_kernel_name(int i) { return wb::detail::kernel_name(i); }
// 1 when kernel i has been looked up for a launch on some device in this process, else 0.
WB_EXPORT int wb_kernel_used(int i) { return wb::detail::kernel_used(i) ? 1 : 0; }

// Sets the hook a launch calls when the live module of its device-only TU lacks its kernel (the
// first step of a two-step load: wb/registry_modules.h's CompleteHook); nullptr removes it.
WB_EXPORT void wb_module_hook(wb::detail::CompleteHook hook) {
  wb::detail::modules().complete.store(hook, std::memory_order_release);
}

// Makes `count` cubins the live module of device-only TU `file`: cubin i is for compute
// capability majors[i].minors[i] (arch-specific when specific[i]), is the file paths[i] (read at
// its first launch), and lowered[i] maps each name expression to its mangled name
// ("expr\tname" lines). Returns 0, or 1 with the error in err.
WB_EXPORT int wb_module_load(const char* file, int count, const int* majors, const int* minors,
                             const int* specific, const char* const* paths,
                             const char* const* lowered, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    std::vector<wb::detail::ImageIn> in;
    for (int i = 0; i < count; ++i) {
      in.push_back({majors[i], minors[i], specific[i] != 0, paths[i], lowered[i]});
    }
    const std::string error = wb::detail::load_module(file, in);
    if (!error.empty()) throw std::runtime_error(error);
  });
}
