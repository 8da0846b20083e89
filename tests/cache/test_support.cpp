#include "test_support.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "cache/layout.hpp"

namespace gmjit::cache::testing {

TempDir::TempDir() {
  std::string pattern = (stdfs::temp_directory_path() / "gmjit-cache-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  // Tests chmod directories; give permissions back so that everything can be removed.
  std::error_code ec;
  stdfs::permissions(path_, stdfs::perms::owner_all, stdfs::perm_options::add, ec);
  for (auto it = stdfs::recursive_directory_iterator(path_, ec);
       !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      stdfs::permissions(it->path(), stdfs::perms::owner_all, stdfs::perm_options::add, ec);
    }
  }
  stdfs::remove_all(path_, ec);
}

std::function<void(std::string_view)> Warnings::sink() const {
  return [lines = lines_](std::string_view line) { lines->emplace_back(line); };
}

std::string Warnings::all() const {
  std::string out;
  for (const std::string& line : *lines_) out += line + "\n";
  return out;
}

DiskCacheConfig config_for(const stdfs::path& root, const Warnings& warnings,
                           std::uint64_t max_bytes) {
  DiskCacheConfig config;
  config.root = root;
  config.max_bytes = max_bytes;
  config.warn = warnings.sink();
  return config;
}

Key128 key_for(std::uint64_t i) {
  return KeyBuilder().add("gmjit-cache-test").add(i).finish();
}

EntryLabels labels_for(std::uint64_t i) {
  return EntryLabels{"0123abcd", i % 2 == 0 ? "grad" : "nograd", "sm_90a",
                     "gmjit_grouped_mlp_" + std::to_string(i)};
}

std::vector<std::byte> payload_for(const Key128& key, std::size_t size) {
  std::vector<std::byte> out(size);
  std::uint64_t x = key.low ^ (key.high * 0x9e3779b97f4a7c15ull) ^ size;
  for (std::byte& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return out;
}

std::vector<stdfs::path> files_matching(const stdfs::path& dir,
                                        const std::function<bool(const std::string&)>& match) {
  std::vector<stdfs::path> out;
  std::error_code ec;
  for (auto it = stdfs::recursive_directory_iterator(dir, ec);
       !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    if (match(it->path().filename().string())) out.push_back(it->path());
  }
  return out;
}

std::vector<stdfs::path> entry_files(const stdfs::path& dir) {
  return files_matching(
      dir, [](const std::string& name) { return name.ends_with(layout::kEntrySuffix); });
}

std::vector<stdfs::path> temp_files(const stdfs::path& dir) {
  return files_matching(dir, [](const std::string& name) { return layout::is_temp_name(name); });
}

stdfs::path entry_path(const DiskCache& cache, const Key128& key, const EntryLabels& labels) {
  return cache.directory() / layout::fanout_name(key) / layout::entry_file_name(key, labels);
}

std::vector<std::byte> read_bytes(const stdfs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

void write_bytes(const stdfs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void set_mtime_seconds_ago(const stdfs::path& path, std::int64_t seconds) {
  timespec times[2];
  times[0].tv_sec = std::time(nullptr) - seconds;
  times[0].tv_nsec = 0;
  times[1] = times[0];
  if (utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
    throw std::runtime_error("utimensat failed on " + path.string());
  }
}

std::int64_t mtime_seconds(const stdfs::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return -1;
  return st.st_mtim.tv_sec;
}

mode_t mode_of(const stdfs::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

bool without_permission_override(const std::function<void()>& body) {
  bool dropped = false;
  std::thread thread([&] {
    // The raw calls: glibc has no wrapper, and libcap's would set the same per-thread sets.
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (syscall(SYS_capget, &header, data) != 0) return;
    for (const int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) {
      data[CAP_TO_INDEX(cap)].effective &= ~CAP_TO_MASK(cap);
    }
    if (syscall(SYS_capset, &header, data) != 0) return;
    dropped = true;
    body();
  });
  thread.join();
  return dropped;
}

DescriptorLimit::DescriptorLimit(int spare) {
  getrlimit(RLIMIT_NOFILE, &saved_);
  const int lowest_free = dup(0);  // open() returns the lowest free number
  close(lowest_free);
  rlimit limit = saved_;
  limit.rlim_cur = static_cast<rlim_t>(lowest_free + spare);
  ok_ = lowest_free >= 0 && setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

DescriptorLimit::~DescriptorLimit() {
  setrlimit(RLIMIT_NOFILE, &saved_);
}

Undeletable::Undeletable(stdfs::path file) : file_(std::move(file)) {
  if (running_as_root()) {
    supported_ = set_immutable(true);
  } else {
    stdfs::permissions(file_.parent_path(), stdfs::perms(0500));
    supported_ = true;
  }
}

Undeletable::~Undeletable() {
  if (!supported_) return;
  if (running_as_root()) {
    set_immutable(false);
  } else {
    std::error_code ec;  // TempDir gives permissions back anyway
    stdfs::permissions(file_.parent_path(), stdfs::perms(0700), ec);
  }
}

bool Undeletable::set_immutable(bool on) const {
  const int fd = open(file_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  int flags = 0;
  bool done = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
  flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
  done = done && ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
  close(fd);
  return done;
}

}  // namespace gmjit::cache::testing
