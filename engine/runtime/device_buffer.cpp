#include "engine/runtime/device_buffer.hpp"

#include <utility>

#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {

DeviceBuffer::DeviceBuffer(const DeviceContext& device, std::size_t bytes)
    : context_(device.context()), bytes_(bytes) {
  if (bytes == 0) return;
  ScopedContext scope(context_);
  check_driver(driver().cuMemAlloc(&pointer_, bytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : context_(std::exchange(other.context_, nullptr)),
      pointer_(std::exchange(other.pointer_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    context_ = std::exchange(other.context_, nullptr);
    pointer_ = std::exchange(other.pointer_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (pointer_ == 0) return;
  const DriverApi& api = driver();
  if (api.cuCtxPushCurrent(context_) == CUDA_SUCCESS) {
    api.cuMemFree(pointer_);
    CUcontext popped = nullptr;
    api.cuCtxPopCurrent(&popped);
  }
  pointer_ = 0;
}

void DeviceBuffer::upload(std::span<const std::byte> bytes) {
  if (bytes.size() > bytes_) throw Error(Status::invalid_argument, "upload larger than buffer");
  ScopedContext scope(context_);
  check_driver(driver().cuMemcpyHtoD(pointer_, bytes.data(), bytes.size()), "cuMemcpyHtoD");
}

void DeviceBuffer::download(std::span<std::byte> bytes) const {
  if (bytes.size() > bytes_) throw Error(Status::invalid_argument, "download larger than buffer");
  ScopedContext scope(context_);
  check_driver(driver().cuMemcpyDtoH(bytes.data(), pointer_, bytes.size()), "cuMemcpyDtoH");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  ScopedContext scope(context_);
  check_driver(driver().cuMemsetD8(pointer_, value, bytes_), "cuMemsetD8");
  check_driver(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace gmjit::engine
