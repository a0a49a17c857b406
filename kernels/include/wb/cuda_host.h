// wb/cuda_host.h: device facts and switches for host launchers (CUDA runtime; no torch header).
//
//   wb::detail::device_attribute<A>()  an attribute of the current device (0 when it cannot be
//                                     read), asked once a device
//   wb::detail::l2_bytes()   bytes of L2 on the current device (0 when it cannot be read)
//   wb::detail::env(name)    an environment switch's value, "" where unset
//   wb::detail::EnvScope     a call's one scan of the environment, which env() reads within it
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

extern "C" char** environ;  // POSIX

namespace wb {
namespace detail {

// An attribute of the current device (0 where it cannot be read), asked once a device and then
// remembered, so that a launcher reading it at every call (a call under CUDA graph capture
// included) queries nothing after the first. A refused query is cleared from the runtime's last
// error (an answer, not an error of the caller's) and asked again at the next call.
template <cudaDeviceAttr kAttr>
int device_attribute() {
  constexpr int kDevices = 64;
  static std::atomic<int64_t> known[kDevices];  // the value + 1; 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    cudaGetLastError();
    return 0;
  }
  const int64_t seen = known[device].load(std::memory_order_relaxed);
  if (seen != 0) return static_cast<int>(seen - 1);
  int value = 0;
  if (cudaDeviceGetAttribute(&value, kAttr, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  known[device].store(int64_t{value} + 1, std::memory_order_relaxed);
  return value;
}

// Bytes of L2 on the current device (0 when it cannot be read).
inline int64_t l2_bytes() { return device_attribute<cudaDevAttrL2CacheSize>(); }

// The environment's WB_ entries ("NAME=value") as a call's EnvScope found them.
struct EnvSnapshot {
  int depth = 0;  // EnvScopes open on this thread
  std::vector<std::string_view> entries;
};

inline EnvSnapshot& env_snapshot() {
  thread_local EnvSnapshot snapshot;
  return snapshot;
}

// Held by an op's CUDA entry for the call: the outermost scope scans the environment once and
// keeps its WB_ entries, so the few dozen switches a launch reads cost one pass over the
// environment rather than a getenv (a pass) each. Read again at every call: a switch set between
// two calls (os.environ in Python) takes effect at the next.
class EnvScope {
 public:
  EnvScope() {
    EnvSnapshot& s = env_snapshot();
    if (s.depth++ > 0) return;
    s.entries.clear();
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const char* v = *e;
      if (v[0] == 'W' && v[1] == 'B' && v[2] == '_') s.entries.emplace_back(v);
    }
  }
  ~EnvScope() { --env_snapshot().depth; }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;
};

// An environment switch's value ("" where unset): the A/B switches launchers read at each call.
// Within an EnvScope, from its scan; elsewhere, getenv. The value ends at a NUL either way
// (data() is a C string).
inline std::string_view env(const char* name) {
  const EnvSnapshot& s = env_snapshot();
  if (s.depth == 0) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  }
  const size_t n = std::strlen(name);
  for (const std::string_view e : s.entries) {
    if (e.size() > n && e[n] == '=' && e.compare(0, n, name) == 0) return e.substr(n + 1);
  }
  return "";
}

}  // namespace detail
}  // namespace wb
