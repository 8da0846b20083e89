#pragma once
// Shared fixtures for the disk cache tests: a private temp directory per test, a warning
// recorder and helpers to find and damage entry files.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/key.hpp"

namespace gmjit::cache::testing {

namespace stdfs = std::filesystem;

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const stdfs::path& path() const { return path_; }

 private:
  stdfs::path path_;
};

// Collects warnings; copies share the same list so a config can outlive the test's handle.
class Warnings {
 public:
  std::function<void(std::string_view)> sink() const;
  std::size_t size() const { return lines_->size(); }
  const std::vector<std::string>& lines() const { return *lines_; }
  std::string all() const;

 private:
  std::shared_ptr<std::vector<std::string>> lines_ = std::make_shared<std::vector<std::string>>();
};

DiskCacheConfig config_for(const stdfs::path& root, const Warnings& warnings,
                           std::uint64_t max_bytes = 1ull << 30);

Key128 key_for(std::uint64_t i);
EntryLabels labels_for(std::uint64_t i);
// Deterministic bytes that depend on the key, so any reader can check what it got.
std::vector<std::byte> payload_for(const Key128& key, std::size_t size = 1000);

std::vector<stdfs::path> files_matching(const stdfs::path& dir,
                                        const std::function<bool(const std::string&)>& match);
std::vector<stdfs::path> entry_files(const stdfs::path& dir);  // *.gmk
std::vector<stdfs::path> temp_files(const stdfs::path& dir);   // .tmp-*
stdfs::path entry_path(const DiskCache& cache, const Key128& key, const EntryLabels& labels);

std::vector<std::byte> read_bytes(const stdfs::path& path);
void write_bytes(const stdfs::path& path, const std::vector<std::byte>& bytes);
void set_mtime_seconds_ago(const stdfs::path& path, std::int64_t seconds);
std::int64_t mtime_seconds(const stdfs::path& path);
mode_t mode_of(const stdfs::path& path);
inline bool running_as_root() {
  return geteuid() == 0;
}

// Runs `body` on a thread of its own without the capabilities that let root ignore permission
// bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH; capabilities are per thread), so that a test of a
// directory's permissions works as root too; as a user it just runs `body`. false where they
// cannot be dropped: `body` did not run, and the test skips.
bool without_permission_override(const std::function<void()>& body);

// Lowers this process's open-file limit so that only `spare` more descriptors can be opened
// (then open() fails with EMFILE, as in a job that ran out of them), and restores it. ok() is
// false where the limit cannot be lowered: the test then skips. Root ignores permission bits, so
// this is how a test running as root makes a directory fail to open or list.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(int spare);
  ~DescriptorLimit();
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// Makes an entry file impossible for this process to unlink, for real: as root (which ignores
// permission bits) with the immutable attribute, otherwise by taking write permission from its
// folder (so the folder's other entries are stuck too). supported() is false where that cannot
// be done (a filesystem without the attribute): the test then skips. Undone on destruction.
class Undeletable {
 public:
  explicit Undeletable(stdfs::path file);
  ~Undeletable();
  Undeletable(const Undeletable&) = delete;
  Undeletable& operator=(const Undeletable&) = delete;
  bool supported() const { return supported_; }

 private:
  bool set_immutable(bool on) const;
  stdfs::path file_;
  bool supported_ = false;
};

}  // namespace gmjit::cache::testing
