// wb/registry_modules.h: the modules of device-only TUs, for bindings/registry.cpp only.
//
// Host launchers name each kernel they launch (wb/module.h); the names are registered while the
// library loads, and the driver reads them (wb_kernel_count, wb_kernel_name), compiles each
// device-only TU for those names, one cubin per GPU architecture, and hands the cubins over
// (wb_module_load). A later wb_module_load for the same file swaps the module: each launcher's
// kernel is looked up again in the new module on its next launch, per device, and no host code
// changes. The cubins are loaded into the driver lazily, at the first launch that needs them,
// with context-independent loading (cuLibraryLoadData): one load serves every device of the
// process; each device launches from the cubin built for its architecture.
//
// A reload in a live process may load a module in two steps (workbench/device.py): first the
// kernels the process has launched so far, then, compiled behind them, all of them. A launch of a
// kernel the first module lacks asks the driver's completion hook (wb_module_hook), which waits
// for the whole module, swaps it in and lets the launch look its kernel up again.
//
// Old modules are never unloaded: a CUDA graph captured before a swap keeps replaying the
// kernels it captured, and a launch queued on a stream may still be waiting for them. A module
// is a few hundred KiB of device memory at most; a process that reloads a kernel 200 times
// keeps 200 of them.
#pragma once

#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "wb/module.h"

#ifdef WB_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
// Modules need the CUDA 12 driver API (cuLibraryLoadData, CUkernel); with an older toolkit a
// launch of a device-only TU's kernel fails with an error that says so.
#if CUDA_VERSION >= 12000
#define WB_DEVICE_MODULES 1
#endif
#endif

namespace wb::detail {

#ifdef WB_DEVICE_MODULES
using KernelHandle = CUkernel;
using LibraryHandle = CUlibrary;
#else
using KernelHandle = void*;
using LibraryHandle = void*;
#endif

constexpr int kMaxDevices = 64;

// One cubin of a module: its architecture and the mangled name of each kernel expression.
struct Image {
  int major = 0, minor = 0;
  bool arch_specific = false;  // sm_90a: runs on exactly that architecture
  std::string path;            // the cubin's file, read at the first launch that needs it
  std::string bytes;
  std::map<std::string, std::string> lowered;  // expression -> mangled name
  LibraryHandle library = nullptr;             // loaded at first use
  std::string load_error;
};

struct Module {
  std::vector<std::unique_ptr<Image>> images;
};

// A device-only TU's modules: the live one (the last loaded) and the ones before it.
struct ModuleFile {
  std::string file;
  std::atomic<uint64_t> generation{0};  // 0: no module loaded yet
  std::deque<Module> modules;           // back(): the live one; older ones stay loaded
};

struct PerDevice {
  std::atomic<uint64_t> generation{0};  // of the module `kernel` was looked up in
  KernelHandle kernel = nullptr;
  int smem_opt_in = 48 * 1024;  // dynamic shared memory allowed without an attribute
  int carveout = -1;            // the preferred shared-memory carveout set, -1: none
  int attributes[5] = {};       // KernelAttr's, read when the kernel was looked up
  std::string value;            // a global's bytes (a slot whose expression starts with '&')
};

struct KernelSlot {
  ModuleFile* file;
  std::string expression;
  PerDevice devices[kMaxDevices];
};

// The driver's completion hook: for `file`, whose live module lacks the kernel `expression` (or
// which has no module yet), loads a module that holds it: a reload's whole module once compiled,
// or a tune variant's module with that kernel added. Returns 1 once it is loaded, 0 when none is
// coming, -1 when its compile failed (the error in message, at most capacity bytes with its NUL).
using CompleteHook = int (*)(const char* file, const char* expression, char* message, int capacity);

struct ModuleTable {
  std::mutex mutex;  // taken to register, load, and look a kernel up: never on a launch's fast path
  std::atomic<CompleteHook> complete{nullptr};
  std::map<std::string, std::unique_ptr<ModuleFile>> files;
  std::deque<KernelSlot> slots;  // stable addresses: launchers keep pointers
  uint64_t next_generation = 1;
};

inline ModuleTable& modules() {
  static ModuleTable table;
  return table;
}

KernelSlot* register_kernel(const char* file, std::string expression) {
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (KernelSlot& s : t.slots) {
    if (s.file->file == file && s.expression == expression) return &s;
  }
  auto& entry = t.files[file];
  if (!entry) {
    entry = std::make_unique<ModuleFile>();
    entry->file = file;
  }
  t.slots.emplace_back();
  KernelSlot& slot = t.slots.back();
  slot.file = entry.get();
  slot.expression = std::move(expression);
  return &slot;
}

inline int kernel_count() {
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  return static_cast<int>(t.slots.size());
}

// Kernel i as "file\texpression", or nullptr; the text stays valid until the thread's next call.
inline const char* kernel_name(int i) {
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (i < 0 || i >= static_cast<int>(t.slots.size())) return nullptr;
  thread_local std::string text;
  text = t.slots[i].file->file + "\t" + t.slots[i].expression;
  return text.c_str();
}

// Whether kernel i has been looked up for a launch (or global i read) on some device in this
// process: what a run of the library's ops used. wb tune compiles a variant's device-only TUs
// for these kernels alone (workbench/tuning/run.py).
inline bool kernel_used(int i) {
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (i < 0 || i >= static_cast<int>(t.slots.size())) return false;
  for (const PerDevice& pd : t.slots[i].devices) {
    if (pd.generation.load(std::memory_order_acquire) != 0) return true;
  }
  return false;
}

// The text of the last error of this thread (a launch's Status points into it).
inline Status fail(std::string text) {
  thread_local std::string last;
  last = std::move(text);
  return last.c_str();
}

#ifdef WB_DEVICE_MODULES

// The driver functions, from the runtime's entry-point lookup: no link against libcuda.
struct Driver {
  decltype(&::cuLibraryLoadData) library_load_data = nullptr;
  decltype(&::cuLibraryGetKernel) library_get_kernel = nullptr;
  decltype(&::cuLibraryGetGlobal) library_get_global = nullptr;
  decltype(&::cuMemcpyDtoH) memcpy_dtoh = nullptr;
  decltype(&::cuKernelSetAttribute) kernel_set_attribute = nullptr;
  decltype(&::cuKernelGetAttribute) kernel_get_attribute = nullptr;
#if CUDA_VERSION >= 12040
  decltype(&::cuKernelGetParamInfo) kernel_get_param_info = nullptr;  // CUDA 12.4 drivers on
#else
  void* kernel_get_param_info = nullptr;  // not in these headers: argument sizes go unchecked
#endif
  decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  std::string error;
};

template <typename F>
void entry_point(const char* name, F& fn, std::string& error) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, CUDART_VERSION, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    if (error.empty()) error = std::string("the CUDA driver has no ") + name;
    return;
  }
  fn = reinterpret_cast<F>(p);
}

inline const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    entry_point("cuLibraryLoadData", r.library_load_data, r.error);
    entry_point("cuLibraryGetKernel", r.library_get_kernel, r.error);
    entry_point("cuLibraryGetGlobal", r.library_get_global, r.error);
    entry_point("cuMemcpyDtoH", r.memcpy_dtoh, r.error);
    entry_point("cuKernelSetAttribute", r.kernel_set_attribute, r.error);
    entry_point("cuKernelGetAttribute", r.kernel_get_attribute, r.error);
    entry_point("cuLaunchKernelEx", r.launch_kernel_ex, r.error);
    entry_point("cuDeviceGet", r.device_get, r.error);
    entry_point("cuGetErrorString", r.get_error_string, r.error);
    std::string optional;
#if CUDA_VERSION >= 12040
    entry_point("cuKernelGetParamInfo", r.kernel_get_param_info, optional);
#endif
    return r;
  }();
  return d;
}

inline std::string cu_error(CUresult r) {
  const char* text = nullptr;
  if (driver().get_error_string != nullptr) driver().get_error_string(r, &text);
  return text != nullptr ? text : "CUDA driver error " + std::to_string(static_cast<int>(r));
}

inline std::string arch_name(int major, int minor, bool specific) {
  return "sm_" + std::to_string(major) + std::to_string(minor) + (specific ? "a" : "");
}

// The image of `m` that holds `expression` and runs on a device of compute capability
// major.minor: built for the same architecture, else for the newest of the same major version
// below it (not an arch-specific one). A module may hold several images of one architecture,
// each with some of the file's kernels (the driver compiles them in parallel). With an empty
// `expression`, any image of that architecture.
inline Image* image_for(Module& m, int major, int minor, const std::string& expression) {
  Image* best = nullptr;
  for (auto& img : m.images) {
    if (img->major != major || img->minor > minor) continue;
    if (img->arch_specific && img->minor != minor) continue;
    if (!expression.empty() && img->lowered.count(expression) == 0) continue;
    if (best == nullptr || img->minor > best->minor) best = img.get();
  }
  return best;
}

// The attributes resolve() reads for DeviceKernel::attribute (KernelAttr's values).
constexpr KernelAttr kKernelAttrs[] = {KernelAttr::max_threads, KernelAttr::static_smem,
                                       KernelAttr::local_bytes, KernelAttr::num_regs};

static_assert(static_cast<int>(KernelAttr::max_threads) ==
                      CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK &&
                  static_cast<int>(KernelAttr::static_smem) ==
                      CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES &&
                  static_cast<int>(KernelAttr::local_bytes) == CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES &&
                  static_cast<int>(KernelAttr::num_regs) == CU_FUNC_ATTRIBUTE_NUM_REGS,
              "KernelAttr holds the driver's numbers");

// Reads the value of the global `mangled` of img (loaded) on `device` into the slot's bytes.
inline Status resolve_global(KernelSlot* slot, int device, Image& img, const std::string& mangled) {
  const Driver& d = driver();
  // The copy runs in the device's primary context: a thread that never used the runtime (an
  // autograd worker) has no current context until cudaSetDevice makes it so.
  if (cudaSetDevice(device) != cudaSuccess) return fail(cudaGetErrorString(cudaGetLastError()));
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUresult r = d.library_get_global(&ptr, &bytes, img.library, mangled.c_str());
  if (r != CUDA_SUCCESS) {
    return fail("variable " + slot->expression.substr(1) + " not found in " + slot->file->file +
                ": " + cu_error(r));
  }
  PerDevice& pd = slot->devices[device];
  pd.value.assign(bytes, '\0');
  r = d.memcpy_dtoh(pd.value.data(), ptr, bytes);
  if (r != CUDA_SUCCESS) {
    return fail("reading " + slot->expression.substr(1) + " of " + slot->file->file +
                " failed: " + cu_error(r));
  }
  pd.generation.store(slot->file->generation.load(std::memory_order_acquire),
                      std::memory_order_release);
  return nullptr;
}

// Looks slot's kernel up in the live module for `device`; called under the table's mutex.
// *missing: set when the live module has an image for the device that lacks the kernel.
inline Status resolve(KernelSlot* slot, int device, const size_t* sizes, int count, bool* missing) {
  const Driver& d = driver();
  if (!d.error.empty()) return fail(d.error + " (a CUDA 12 driver is needed for device-only TUs)");
  ModuleFile& f = *slot->file;
  if (f.modules.empty()) {
    if (missing != nullptr) *missing = true;  // a tune variant's file no kernel was compiled of
    return fail("no module is loaded for " + f.file + " (kernel " + slot->expression +
                "); the workbench loads it with the library: was the library opened by hand?");
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  Image* img = image_for(f.modules.back(), major, minor, slot->expression);
  if (img == nullptr && image_for(f.modules.back(), major, minor, "") != nullptr) {
    if (missing != nullptr) *missing = true;
    return fail(f.file + " was compiled without " + slot->expression +
                "; reload the library (the launcher names it, the module was built before)");
  }
  if (img == nullptr) {
    std::string built;
    for (auto& i : f.modules.back().images) {
      const std::string arch = arch_name(i->major, i->minor, i->arch_specific);
      if (built.find(arch) == std::string::npos) built += (built.empty() ? "" : ", ") + arch;
    }
    return fail(f.file + " has no cubin for device " + std::to_string(device) + " (sm_" +
                std::to_string(major) + std::to_string(minor) + "); built for " + built +
                ": add the architecture to TORCH_CUDA_ARCH_LIST");
  }
  auto name = img->lowered.find(slot->expression);
  if (img->library == nullptr) {
    if (!img->load_error.empty()) return fail(img->load_error);
    if (img->bytes.empty()) {
      std::ifstream in(img->path, std::ios::binary);
      img->bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) img->bytes.clear();
      if (img->bytes.empty()) {
        return fail("cannot read " + img->path + ", the cubin of " + f.file +
                    " (removed from the cache?): reload the library to compile it again");
      }
    }
    CUlibrary lib = nullptr;
    const CUresult r =
        d.library_load_data(&lib, img->bytes.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (r != CUDA_SUCCESS) {
      img->load_error = "loading the cubin of " + f.file + " failed: " + cu_error(r);
      return fail(img->load_error);
    }
    img->library = lib;
  }
  PerDevice& pd = slot->devices[device];
  if (slot->expression[0] == '&') return resolve_global(slot, device, *img, name->second);
  CUkernel k = nullptr;
  CUresult r = d.library_get_kernel(&k, img->library, name->second.c_str());
  if (r != CUDA_SUCCESS) {
    return fail("kernel " + slot->expression + " not found in " + f.file + ": " + cu_error(r));
  }
#if CUDA_VERSION >= 12040
  if (d.kernel_get_param_info != nullptr) {
    // Parameter i of the kernel against argument i of the launch. Only indices the launch uses
    // are asked for: asking past the kernel's last parameter is an error the driver reports
    // (and compute-sanitizer counts), so a launch with fewer arguments than the kernel has
    // parameters is not caught here.
    std::string theirs, ours;
    bool same = true;
    for (int i = 0; i < count; ++i) {
      size_t offset = 0, size = 0;
      const bool has = d.kernel_get_param_info(k, i, &offset, &size) == CUDA_SUCCESS;
      theirs += (i ? ", " : "") + (has ? std::to_string(size) : std::string("none"));
      ours += (i ? ", " : "") + std::to_string(sizes[i]);
      same = same && has && size == sizes[i];
    }
    if (!same) {
      return fail(slot->expression + " in " + f.file + ": its parameters take " + theirs +
                  " bytes where its launcher passes " + ours +
                  " bytes (\"none\": no such parameter): make the launch's argument types the "
                  "kernel's parameter types");
    }
  }
#endif
  CUdevice dev = 0;
  r = d.device_get(&dev, device);
  for (KernelAttr attr : kKernelAttrs) {
    const int a = static_cast<int>(attr);
    if (r == CUDA_SUCCESS) {
      r = d.kernel_get_attribute(&pd.attributes[a], static_cast<CUfunction_attribute>(a), k, dev);
    }
  }
  if (r != CUDA_SUCCESS) {
    return fail("reading the attributes of " + slot->expression + " failed: " + cu_error(r));
  }
  pd.kernel = k;
  pd.smem_opt_in = 48 * 1024;
  pd.carveout = -1;
  pd.generation.store(f.generation.load(std::memory_order_acquire), std::memory_order_release);
  return nullptr;
}

// The current device, with slot resolved in the live module for it (the fast path: two atomic
// loads). `sizes`: the launch's argument sizes, checked against the kernel's parameters.
inline Status ready(KernelSlot* slot, int* device, const size_t* sizes, int count) {
  if (cudaGetDevice(device) != cudaSuccess) return fail(cudaGetErrorString(cudaGetLastError()));
  if (*device < 0 || *device >= kMaxDevices) return fail("device index out of range");
  PerDevice& pd = slot->devices[*device];
  const uint64_t live = slot->file->generation.load(std::memory_order_acquire);
  if (live == 0 || pd.generation.load(std::memory_order_acquire) != live) {
    std::string lacking;
    {
      std::lock_guard<std::mutex> lock(modules().mutex);
      bool missing = false;
      const Status err = resolve(slot, *device, sizes, count, &missing);
      if (!missing) return err;
      lacking = err;
    }
    // The live module lacks the kernel: the first step of a two-step load, or a tune variant's
    // module. The hook runs without the mutex (it loads a module through load_module, and other
    // threads may launch).
    const CompleteHook hook = modules().complete.load(std::memory_order_acquire);
    char message[2048] = {};
    const int loaded = hook != nullptr ? hook(slot->file->file.c_str(), slot->expression.c_str(),
                                              message, sizeof message)
                                       : 0;
    if (loaded < 0) return fail(message);
    if (loaded == 0) return fail(lacking);
    std::lock_guard<std::mutex> lock(modules().mutex);
    if (const Status err = resolve(slot, *device, sizes, count, nullptr)) return err;
  }
  return nullptr;
}

Status kernel_attribute(KernelSlot* slot, KernelAttr attribute, int* value) {
  const int a = static_cast<int>(attribute);
  bool known = false;
  for (KernelAttr attr : kKernelAttrs) known = known || attr == attribute;
  if (!known) return fail("unknown kernel attribute");
  if (slot->expression[0] == '&') return fail(slot->expression.substr(1) + " is not a kernel");
  int device = 0;
  if (const Status err = ready(slot, &device, nullptr, 0)) return err;
  *value = slot->devices[device].attributes[a];
  return nullptr;
}

Status read_global(KernelSlot* slot, void* out, size_t size) {
  if (slot->expression[0] != '&') return fail(slot->expression + " is a kernel, not a variable");
  int device = 0;
  if (const Status err = ready(slot, &device, nullptr, 0)) return err;
  const std::string& value = slot->devices[device].value;
  if (value.size() != size) {
    return fail(slot->expression.substr(1) + " in " + slot->file->file + " is " +
                std::to_string(value.size()) + " bytes; it is read as " + std::to_string(size) +
                ": read it as the type the device-only TU defines it with");
  }
  std::memcpy(out, value.data(), size);
  return nullptr;
}

// Sets an attribute of pd's kernel on `device` (a launch option that differs from the last).
inline CUresult set_attribute(const PerDevice& pd, int device, CUfunction_attribute attribute,
                              int value) {
  const Driver& d = driver();
  CUdevice dev = 0;
  const CUresult r = d.device_get(&dev, device);
  return r == CUDA_SUCCESS ? d.kernel_set_attribute(attribute, value, pd.kernel, dev) : r;
}

Status launch_kernel(KernelSlot* slot, const LaunchConfig& c, Stream stream, void** args,
                     const size_t* sizes, int count) {
  if (slot->expression[0] == '&') return fail(slot->expression.substr(1) + " is not a kernel");
  int device = 0;
  if (const Status err = ready(slot, &device, sizes, count)) return err;
  PerDevice& pd = slot->devices[device];
  const Driver& d = driver();
  if (c.smem > static_cast<unsigned>(pd.smem_opt_in)) {
    const CUresult r = set_attribute(pd, device, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     static_cast<int>(c.smem));
    if (r != CUDA_SUCCESS) {
      return fail(slot->expression + ": asking for " + std::to_string(c.smem) +
                  " bytes of dynamic shared memory failed: " + cu_error(r));
    }
    pd.smem_opt_in = static_cast<int>(c.smem);
  }
  if (c.carveout >= 0 && c.carveout != pd.carveout) {
    const CUresult r =
        set_attribute(pd, device, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, c.carveout);
    if (r != CUDA_SUCCESS) {
      return fail(slot->expression + ": setting the shared-memory carveout to " +
                  std::to_string(c.carveout) + "% failed: " + cu_error(r));
    }
    pd.carveout = c.carveout;
  }
  CUlaunchConfig config{};
  config.gridDimX = c.grid.x;
  config.gridDimY = c.grid.y;
  config.gridDimZ = c.grid.z;
  config.blockDimX = c.block.x;
  config.blockDimY = c.block.y;
  config.blockDimZ = c.block.z;
  config.sharedMemBytes = c.smem;
  config.hStream = static_cast<CUstream>(stream);
  CUlaunchAttribute cluster{};
  if (c.cluster.x != 0) {
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = c.cluster.x;
    cluster.value.clusterDim.y = c.cluster.y;
    cluster.value.clusterDim.z = c.cluster.z;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  CUresult r = d.launch_kernel_ex(&config, reinterpret_cast<CUfunction>(pd.kernel), args, nullptr);
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A thread the runtime has not bound to the device's context yet (autograd's backward
    // threads): cudaSetDevice makes the primary context current here, as a runtime launch would.
    if (cudaSetDevice(device) == cudaSuccess) {
      r = d.launch_kernel_ex(&config, reinterpret_cast<CUfunction>(pd.kernel), args, nullptr);
    }
  }
  if (r != CUDA_SUCCESS) return fail(slot->expression + ": " + cu_error(r));
  return nullptr;
}

#else  // no CUDA, or a toolkit before CUDA 12: no modules

inline Status no_modules(KernelSlot* slot) {
#ifdef WB_WITH_CUDA
  return fail(slot->expression +
              ": device-only TUs need CUDA 12 or later (cuLibraryLoadData); "
              "this library was built with an older CUDA toolkit");
#else
  return fail(slot->expression + ": this library was built without CUDA");
#endif
}

Status launch_kernel(KernelSlot* slot, const LaunchConfig&, Stream, void**, const size_t*, int) {
  return no_modules(slot);
}
Status kernel_attribute(KernelSlot* slot, KernelAttr, int*) { return no_modules(slot); }
Status read_global(KernelSlot* slot, void*, size_t) { return no_modules(slot); }

#endif

// One cubin handed over by the driver: compute capability major.minor, whether it is the
// arch-specific variant (sm_90a), its file (read at its first use: a process that loads many
// families and launches few reads only those), and its lowered names as lines of
// "expression\tmangled name".
struct ImageIn {
  int major, minor;
  bool arch_specific;
  std::string path;
  std::string lowered;
};

// Makes `images` the live module of `file`; "" or the error.
inline std::string load_module(const std::string& file, const std::vector<ImageIn>& images) {
  Module m;
  for (const ImageIn& in : images) {
    auto img = std::make_unique<Image>();
    img->major = in.major;
    img->minor = in.minor;
    img->arch_specific = in.arch_specific;
    img->path = in.path;
    size_t at = 0;
    const std::string& text = in.lowered;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const size_t tab = text.find('\t', at);
      if (tab == std::string::npos || tab > end) return "bad lowered-name line for " + file;
      img->lowered[text.substr(at, tab - at)] = text.substr(tab + 1, end - tab - 1);
      at = end + 1;
    }
    m.images.push_back(std::move(img));
  }
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& entry = t.files[file];
  if (!entry) {
    entry = std::make_unique<ModuleFile>();
    entry->file = file;
  }
  if (!entry->modules.empty()) {
    // A cubin the live module has loaded already (the second step of a two-step load holds the
    // first step's cubins) keeps its driver library: loaded once, not once per module.
    for (auto& img : m.images) {
      for (auto& old : entry->modules.back().images) {
        if (old->library != nullptr && old->path == img->path) img->library = old->library;
      }
    }
  }
  entry->modules.push_back(std::move(m));
  entry->generation.store(t.next_generation++, std::memory_order_release);
  return "";
}

}  // namespace wb::detail
