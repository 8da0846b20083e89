#include "engine/workspace.hpp"

#include "engine/device_context.hpp"
#include "engine/driver.hpp"
#include "engine/log.hpp"

namespace gmjit::engine {

void* WorkspacePool::get(DeviceContext& device, CUstream stream, Workspace which,
                         std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Slot* slot = nullptr;
  for (Slot& candidate : slots_) {
    if (candidate.device == device.ordinal() && candidate.stream == stream &&
        candidate.which == which) {
      slot = &candidate;
    }
  }
  if (slot == nullptr) slot = &slots_.emplace_back(Slot{device.ordinal(), stream, which, {}});
  if (slot->buffer.size() < bytes) {
    // The old buffer may still be read by work queued on this stream.
    check_driver(driver().cuStreamSynchronize(stream), "cuStreamSynchronize");
    const std::size_t grown = bytes + bytes / 4;
    log(LogLevel::info, "workspace on cuda:{} grows to {} bytes", device.ordinal(), grown);
    slot->buffer = DeviceBuffer();
    slot->buffer = DeviceBuffer(device, grown);
  }
  return slot->buffer.data();
}

}  // namespace gmjit::engine
