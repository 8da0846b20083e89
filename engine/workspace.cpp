#include "engine/workspace.hpp"

#include <array>
#include <atomic>

#include "engine/device_context.hpp"
#include "engine/driver.hpp"
#include "engine/log.hpp"

namespace gmjit::engine {
namespace {

std::uint64_t next_pool_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

struct Entry {
  std::uint64_t pool = 0;
  int device = -1;
  CUstream stream = nullptr;
  Workspace which{};
  DeviceBuffer* buffer = nullptr;
};

// This thread's buffers. A full table overwrites round-robin; the evicted buffer stays owned by
// its pool (freed with it), so nothing dangles.
struct ThreadTable {
  std::array<Entry, 32> entries;
  std::size_t next_victim = 0;
};
thread_local ThreadTable table;

}  // namespace

WorkspacePool::WorkspacePool() : serial_(next_pool_serial()) {}

DeviceBuffer& WorkspacePool::new_buffer() {
  std::lock_guard lock(mutex_);
  return buffers_.emplace_back();
}

void* WorkspacePool::get(DeviceContext& device, CUstream stream, Workspace which,
                         std::size_t bytes) {
  DeviceBuffer* buffer = nullptr;
  for (const Entry& e : table.entries) {
    if (e.pool == serial_ && e.device == device.ordinal() && e.stream == stream &&
        e.which == which) {
      buffer = e.buffer;
      break;
    }
  }
  if (buffer == nullptr) {
    buffer = &new_buffer();
    table.entries[table.next_victim] = Entry{serial_, device.ordinal(), stream, which, buffer};
    table.next_victim = (table.next_victim + 1) % table.entries.size();
  }
  if (buffer->size() < bytes) {
    // Work this thread queued earlier on the stream may still read the old buffer.
    check_driver(driver().cuStreamSynchronize(stream), "cuStreamSynchronize");
    const std::size_t grown = bytes + bytes / 4;
    log(LogLevel::info, "workspace on cuda:{} grows to {} bytes", device.ordinal(), grown);
    *buffer = DeviceBuffer();
    *buffer = DeviceBuffer(device, grown);
  }
  return buffer->data();
}

}  // namespace gmjit::engine
