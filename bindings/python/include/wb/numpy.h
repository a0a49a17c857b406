// wb/numpy.h: NumPy arrays in and out of the registry's torch-free kernels (pybind11).
//
//   wb::Array<T>             an array argument of T (any strides; other dtypes are converted)
//   wb::contiguous(a)        the same data C-contiguous (copied only when it is not)
//   wb::check_same_shape()   a ValueError naming both arguments when their shapes differ
//   wb::DeviceBuffer<T>      (WB_WITH_CUDA) a device copy of n elements: upload, download, free
//   wb::CudaStream           (WB_WITH_CUDA) a non-default stream, synchronised before download
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "wb/types.h"

#ifdef WB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace wb {

namespace py = pybind11;

// An argument: any strides, so that overloads per dtype match before any conversion.
template <typename T>
using Array = py::array_t<T, py::array::forcecast>;
// What kernels see: C-contiguous.
template <typename T>
using Contiguous = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
Contiguous<T> contiguous(const Array<T>& a) {
  return Contiguous<T>::ensure(a);
}

template <typename T>
void check_same_shape(const char* op, const Array<T>& a, const char* a_name, const Array<T>& b,
                      const char* b_name) {
  const bool same = a.ndim() == b.ndim() &&
                    std::equal(a.shape(), a.shape() + a.ndim(), b.shape(), b.shape() + b.ndim());
  if (!same) {
    throw py::value_error(std::string(op) + ": expected " + b_name + " to have the shape of " +
                          a_name);
  }
}

template <typename T>
Contiguous<T> empty_like(const Contiguous<T>& a) {
  return Contiguous<T>(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

// A kernel launcher's Status as an exception (RuntimeError in Python).
inline void check_status(const char* op, Status status) {
  if (status != nullptr)
    throw std::runtime_error(std::string(op) + ": CUDA kernel failed: " + status);
}

#ifdef WB_WITH_CUDA
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

class CudaStream {
 public:
  CudaStream() { cuda_check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  ~CudaStream() { cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { cuda_check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t s_ = nullptr;
};

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    if (n_ > 0) cuda_check(cudaMalloc(&p_, n_ * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  void upload(const T* host, const CudaStream& s) {
    if (n_ > 0)
      cuda_check(cudaMemcpyAsync(p_, host, n_ * sizeof(T), cudaMemcpyHostToDevice, s.get()),
                 "upload");
  }
  void download(T* host, const CudaStream& s) const {
    if (n_ > 0)
      cuda_check(cudaMemcpyAsync(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s.get()),
                 "download");
    s.sync();
  }

 private:
  int64_t n_;
  T* p_ = nullptr;
};
#endif

}  // namespace wb
