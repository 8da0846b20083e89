#include "cache/fs_util.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>

namespace gmjit::cache::fs {
namespace {

constexpr std::int64_t kNsPerSecond = 1'000'000'000;

// Saturating: a stamp past 2262 (or before 1677) does not fit int64 nanoseconds, and must read as
// far in the future (or past) rather than wrap.
std::int64_t to_ns(const timespec& ts) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const auto seconds = static_cast<std::int64_t>(ts.tv_sec);
  if (seconds > (kMax - kNsPerSecond) / kNsPerSecond) return kMax;
  if (seconds < (kMin + kNsPerSecond) / kNsPerSecond) return kMin;
  return seconds * kNsPerSecond + ts.tv_nsec;
}

FileInfo from_stat(const struct stat& st) {
  FileInfo info;
  info.size = static_cast<std::uint64_t>(st.st_size);
  info.mtime_ns = to_ns(st.st_mtim);
  info.mode = st.st_mode;
  info.uid = st.st_uid;
  info.dev = st.st_dev;
  info.ino = st.st_ino;
  return info;
}

struct DirCloser {
  void operator()(DIR* dir) const { closedir(dir); }
};

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool FileInfo::is_regular() const {
  return S_ISREG(mode);
}
bool FileInfo::is_directory() const {
  return S_ISDIR(mode);
}

std::optional<FileInfo> stat_no_follow(const std::filesystem::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return std::nullopt;
  return from_stat(st);
}

FileInfo info_of(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return FileInfo{};
  return from_stat(st);
}

UniqueFd open_directory_at(int dir_fd, const char* name) {
  return UniqueFd(openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

std::optional<FileInfo> stat_at(int dir_fd, const std::string& name) {
  struct stat st {};
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  return from_stat(st);
}

int list_directory(int dir_fd, std::vector<std::string>& names) {
  names.clear();
  // A fresh open file description of the same directory: its own offset, closed by closedir.
  const int own = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (own < 0) return errno;
  std::unique_ptr<DIR, DirCloser> handle(fdopendir(own));
  if (!handle) {
    const int error = errno;
    close(own);
    return error;
  }
  for (;;) {
    errno = 0;  // readdir returns null both at the end and on an error
    const dirent* entry = readdir(handle.get());
    if (entry == nullptr) return errno;
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
}

std::vector<std::string> list_directory(int dir_fd) {
  std::vector<std::string> names;
  list_directory(dir_fd, names);
  return names;
}

int make_private_directories(const std::filesystem::path& dir) {
  if (dir.empty()) return ENOENT;
  std::filesystem::path current;
  for (const std::filesystem::path& part : dir) {
    current /= part;
    if (mkdir(current.c_str(), 0700) == 0) {
      // The umask may have removed bits we need; never add any for group/others. Through a
      // handle that does not follow a symlink: a writable parent's owner could swap the new
      // folder for a link to a file of ours between the two calls.
      if (const UniqueFd made = open_directory_at(AT_FDCWD, current.c_str()); made.valid()) {
        fchmod(made.get(), 0700);
      }
      continue;
    }
    const int error = errno;
    if (error != EEXIST) return error;
    struct stat st {};
    if (stat(current.c_str(), &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  }
  return 0;
}

bool owner_allowed(uid_t uid, Owners owners) {
  return uid == geteuid() || (owners == Owners::self_or_root && uid == 0);
}

DirTrust check_directory(const std::filesystem::path& dir, Owners owners) {
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    return (errno == ENOENT || errno == ENOTDIR) ? DirTrust::kMissing : DirTrust::kInaccessible;
  }
  if (S_ISLNK(st.st_mode)) return DirTrust::kSymlink;
  if (!S_ISDIR(st.st_mode)) return DirTrust::kNotDirectory;
  if (!owner_allowed(st.st_uid, owners)) return DirTrust::kForeignOwner;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return DirTrust::kWritableByOthers;
  return DirTrust::kTrusted;
}

DirTrust check_directory(int dir_fd, Owners owners) {
  struct stat st {};
  if (fstat(dir_fd, &st) != 0) return DirTrust::kInaccessible;
  if (!S_ISDIR(st.st_mode)) return DirTrust::kNotDirectory;
  if (!owner_allowed(st.st_uid, owners)) return DirTrust::kForeignOwner;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return DirTrust::kWritableByOthers;
  return DirTrust::kTrusted;
}

DirTrust trust_after_open_error(int dir_fd, const std::string& name, int error) {
  if (const std::optional<FileInfo> info = stat_at(dir_fd, name)) {
    if (S_ISLNK(info->mode)) return DirTrust::kSymlink;
    if (!info->is_directory()) return DirTrust::kNotDirectory;
  }
  switch (error) {
    case ENOENT:
      return DirTrust::kMissing;
    case ELOOP:
      return DirTrust::kSymlink;
    case ENOTDIR:
      return DirTrust::kNotDirectory;
    default:
      return DirTrust::kInaccessible;
  }
}

const char* to_string(DirTrust trust) {
  switch (trust) {
    case DirTrust::kMissing:
      return "missing";
    case DirTrust::kTrusted:
      return "trusted";
    case DirTrust::kInaccessible:
      return "not accessible";
    case DirTrust::kSymlink:
      return "a symbolic link";
    case DirTrust::kNotDirectory:
      return "not a directory";
    case DirTrust::kForeignOwner:
      return "owned by another user";
    case DirTrust::kWritableByOthers:
      return "writable by group or others";
  }
  return "unknown";
}

int read_file(int fd, std::uint64_t max_bytes, std::vector<std::byte>& out) {
  const FileInfo info = info_of(fd);
  if (!info.is_regular()) return EINVAL;
  if (info.size > max_bytes) return EFBIG;
  out.resize(static_cast<std::size_t>(info.size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) break;  // shrank under us: decode() reports it as truncated
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return 0;
}

int write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}

void fsync_directory(int dir_fd) {
  fsync(dir_fd);
}

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return to_ns(ts);
}

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return to_ns(ts);
}

std::int64_t age_ns(std::int64_t now, std::int64_t stamp) {
  std::int64_t age = 0;
  if (!__builtin_sub_overflow(now, stamp, &age)) return age;
  return stamp < 0 ? std::numeric_limits<std::int64_t>::max()
                   : std::numeric_limits<std::int64_t>::min();
}

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r may return a static string instead of filling the buffer.
  const char* text = strerror_r(error, buffer, sizeof(buffer));
  return text != nullptr ? std::string(text) : "errno " + std::to_string(error);
}

}  // namespace gmjit::cache::fs
