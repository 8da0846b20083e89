#include "engine/runtime/device_context.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

#include <fmt/format.h>

#include "engine/runtime/driver.hpp"

namespace gmjit::engine {

std::string arch_for_compute_capability(int major, int minor) {
  if (major == 9 && minor == 0) return "sm_90a";
  return fmt::format("sm_{}{}", major, minor);
}

namespace {

// Device-level queries only: no context is made (describing every GPU must not create one on
// each, hundreds of MB apiece, in every rank of a job).
DeviceInfo describe_device(int ordinal) {
  const DriverApi& api = driver();
  CUdevice device = 0;
  check_driver(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  // Checked: a failed query would pass for arch sm_00 or 0 multiprocessors (a grid of 0 CTAs).
  std::array<char, 256> name{};
  check_driver(api.cuDeviceGetName(name.data(), static_cast<int>(name.size()), device),
               "cuDeviceGetName");
  int major = 0, minor = 0, sms = 0;
  check_driver(
      api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
      "cuDeviceGetAttribute(compute capability major)");
  check_driver(
      api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
      "cuDeviceGetAttribute(compute capability minor)");
  check_driver(api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
               "cuDeviceGetAttribute(multiprocessor count)");
  size_t memory = 0;
  check_driver(api.cuDeviceTotalMem(&memory, device), "cuDeviceTotalMem");
  return DeviceInfo{ordinal, name.data(), arch_for_compute_capability(major, minor), sms, memory};
}

}  // namespace

DeviceContext::DeviceContext(int ordinal) : ordinal_(ordinal) {
  const DriverApi& api = driver();
  check_driver(api.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check_driver(api.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  info_ = describe_device(ordinal);
}

DeviceContext::~DeviceContext() {
  if (context_ != nullptr) driver().cuDevicePrimaryCtxRelease(device_);
}

void DeviceContext::check_stream(CUstream stream) const {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  const DriverApi& api = driver();
  CUcontext owner = nullptr;
  check_driver(api.cuStreamGetCtx(stream, &owner), "cuStreamGetCtx (stream: not a valid stream?)");
  if (owner == context_) return;
  CUdevice owner_device = -1;
  {
    const ScopedContext scope(owner);
    check_driver(api.cuCtxGetDevice(&owner_device), "cuCtxGetDevice (the stream's context)");
  }
  if (owner_device == device_) return;
  // Its kernels would run on the stream's device, on pointers of this one.
  throw Error(Status::invalid_argument,
              fmt::format("stream: expected a stream of cuda:{} (the tensors' device) or a default "
                          "stream, got a stream of cuda:{}",
                          ordinal_, static_cast<int>(owner_device)));
}

ScopedContext::ScopedContext(CUcontext context) {
  check_driver(driver().cuCtxPushCurrent(context), "cuCtxPushCurrent");
}

ScopedContext::~ScopedContext() {
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

// Devices are created on first use; lookups of an existing device read an atomic pointer and
// take no lock.
struct DeviceRegistry::Impl {
  std::mutex create_mutex;
  std::array<std::atomic<DeviceContext*>, kMaxDevices> devices{};
  std::array<std::unique_ptr<DeviceContext>, kMaxDevices> owned;
  int count = -1;
};

DeviceRegistry::DeviceRegistry() : impl_(std::make_unique<Impl>()) {}

DeviceRegistry& DeviceRegistry::instance() {
  // Never destroyed: an engine that outlives static destruction (a static one, the Python
  // package's) still holds raw pointers to these contexts; the driver frees them at exit.
  static DeviceRegistry* registry = new DeviceRegistry;
  return *registry;
}

int DeviceRegistry::device_count() {
  std::lock_guard lock(impl_->create_mutex);
  if (impl_->count < 0) {
    int count = 0;
    if (driver_available()) check_driver(driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
    impl_->count = std::min(count, kMaxDevices);
  }
  return impl_->count;
}

DeviceContext& DeviceRegistry::get(int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxDevices) {
    if (DeviceContext* ready = impl_->devices[ordinal].load(std::memory_order_acquire)) {
      return *ready;
    }
  }
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    std::string why;
    if (!driver_available(&why)) throw Error(Status::no_device, why);
    throw Error(Status::no_device, fmt::format("CUDA device {} does not exist; this machine has "
                                               "{} device(s)",
                                               ordinal, count));
  }
  std::lock_guard lock(impl_->create_mutex);
  if (!impl_->owned[ordinal]) {
    impl_->owned[ordinal] = std::make_unique<DeviceContext>(ordinal);
    impl_->devices[ordinal].store(impl_->owned[ordinal].get(), std::memory_order_release);
  }
  return *impl_->owned[ordinal];
}

std::vector<DeviceInfo> DeviceRegistry::describe_all() {
  std::vector<DeviceInfo> infos;
  for (int i = 0; i < device_count(); ++i) infos.push_back(describe_device(i));
  return infos;
}

}  // namespace gmjit::engine
