#pragma once
// Publish faults for the disk cache tests: failures that are hard to cause for real, installed
// through DiskCacheConfig::publish_hooks. Header-only, so that the cache tests need nothing but
// gmjit_cache.
#include <signal.h>

#include <cerrno>
#include <cstddef>
#include <memory>

#include "cache/disk_cache.hpp"

namespace gmjit::testing {

enum class CacheFault {
  kEnospc,            // the entry write stops half-way and fails with ENOSPC
  kKillMidWrite,      // SIGKILL this process half-way through the temp file
  kKillBeforeRename,  // SIGKILL after the temp file is complete and synced, before the rename
};

// Hooks that cause `fault` on every publish of the cache they are installed in.
inline std::shared_ptr<const cache::PublishHooks> publish_fault(CacheFault fault) {
  class Hooks final : public cache::PublishHooks {
   public:
    explicit Hooks(CacheFault fault) : fault_(fault) {}
    std::size_t bytes_to_write(std::size_t total) const override {
      return fault_ == CacheFault::kKillBeforeRename ? total : total / 2;
    }
    int after_write() const override {
      if (fault_ == CacheFault::kKillMidWrite) raise(SIGKILL);
      return fault_ == CacheFault::kEnospc ? ENOSPC : 0;
    }
    void before_rename() const override {
      if (fault_ == CacheFault::kKillBeforeRename) raise(SIGKILL);
    }

   private:
    CacheFault fault_;
  };
  return std::make_shared<const Hooks>(fault);
}

}  // namespace gmjit::testing
