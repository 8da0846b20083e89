#pragma once

namespace gmjit::engine {

// Devices per process the engine serves (ordinals 0 to 63): per-device tables are fixed arrays
// of this size, read without a lock.
inline constexpr int kMaxDevices = 64;

}  // namespace gmjit::engine
