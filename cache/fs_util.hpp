#pragma once
// Thin POSIX helpers for the disk cache. They report errors as errno values and never throw
// (apart from std::bad_alloc), so that cache failures can always be turned into misses.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gmjit::cache::fs {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

struct FileInfo {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;  // saturated to the int64 range (a stamp past 2262 is the largest)
  mode_t mode = 0;
  uid_t uid = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool is_regular() const;
  bool is_directory() const;
};

std::optional<FileInfo> stat_no_follow(const std::filesystem::path& path);
FileInfo info_of(int fd);  // fstat; zeroes on failure

// mkdir -p with mode 0700 for every component it creates. Returns 0 or an errno.
int make_private_directories(const std::filesystem::path& dir);

// Opens a directory for use as the base of *at() calls: O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, so a
// symlink in its place is refused (ELOOP) rather than followed. Invalid on failure (errno set).
UniqueFd open_directory_at(int dir_fd, const char* name);
// fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW); nullopt with errno set on failure.
std::optional<FileInfo> stat_at(int dir_fd, const std::string& name);
// Names in an opened directory except "." and ".."; the handle's own offset is not used, so
// threads may list the same handle at once. Returns 0 or an errno (names then holds what was
// read before the error).
int list_directory(int dir_fd, std::vector<std::string>& names);
// The same where a directory that cannot be listed may pass for an empty one (a lookup: a miss).
std::vector<std::string> list_directory(int dir_fd);

enum class DirTrust {
  kMissing,
  kTrusted,
  kInaccessible,
  kSymlink,
  kNotDirectory,
  kForeignOwner,
  kWritableByOthers,
};
// Who may own a directory we load code from: the effective user (the local cache), or also root
// (a read-only shared layer shipped in an image or mounted by an administrator).
enum class Owners { self, self_or_root };
// A directory is trusted when it is a real directory (not a symlink), owned as `owners` allows
// and not writable by group or others: a cubin loaded from it is code we will run.
DirTrust check_directory(const std::filesystem::path& dir, Owners owners = Owners::self);
// The same for an opened directory (nothing can be swapped between the check and the use).
DirTrust check_directory(int dir_fd, Owners owners = Owners::self);
bool owner_allowed(uid_t uid, Owners owners);
// Why open_directory_at(dir_fd, name) failed with `error`, from what is at that name now (with
// O_DIRECTORY, Linux reports a symlink as ENOTDIR, not ELOOP).
DirTrust trust_after_open_error(int dir_fd, const std::string& name, int error);
const char* to_string(DirTrust trust);

// Reads a whole regular file opened without following symlinks. Returns 0 or an errno
// (EFBIG when larger than max_bytes, EINVAL when not a regular file).
int read_file(int fd, std::uint64_t max_bytes, std::vector<std::byte>& out);
int write_all(int fd, std::span<const std::byte> bytes);
void fsync_directory(int dir_fd);  // best effort

std::int64_t now_ns();
// A clock that never steps (timers: an NTP step back must not stretch a pause).
std::int64_t monotonic_ns();
// now - stamp, saturated (stamps are saturated, so the plain difference can overflow); negative
// for a stamp in the future.
std::int64_t age_ns(std::int64_t now, std::int64_t stamp);

std::string errno_text(int error);

}  // namespace gmjit::cache::fs
