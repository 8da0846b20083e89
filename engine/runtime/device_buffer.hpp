#pragma once
// An owning device allocation (cuMemAlloc/cuMemFree in the device's primary context).
#include <cuda.h>

#include <cstddef>
#include <span>

namespace gmjit::engine {

class DeviceContext;

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceContext& device, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(pointer_); }
  std::size_t size() const { return bytes_; }

  void upload(std::span<const std::byte> bytes);    // synchronous
  void download(std::span<std::byte> bytes) const;  // synchronous
  void fill_bytes(unsigned char value);             // synchronous

 private:
  void release() noexcept;
  CUcontext context_ = nullptr;
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gmjit::engine
