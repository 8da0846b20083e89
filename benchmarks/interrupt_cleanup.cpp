#include "benchmarks/interrupt_cleanup.hpp"

#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gmjit::bench {
namespace {

std::mutex folders_mutex;
std::vector<std::filesystem::path> folders;

sigset_t interrupt_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

[[noreturn]] void wait_and_clean_up(sigset_t set) {
  int signal = SIGTERM;
  while (sigwait(&set, &signal) != 0) {
  }
  {
    const std::lock_guard lock(folders_mutex);
    for (const std::filesystem::path& folder : folders) {
      std::error_code ignored;  // best effort, as TempDir's destructor
      std::filesystem::remove_all(folder, ignored);
    }
  }
  // End as the signal would have: default action, delivered to this thread (which unblocks it).
  std::signal(signal, SIG_DFL);
  sigset_t just_this;
  sigemptyset(&just_this);
  sigaddset(&just_this, signal);
  pthread_sigmask(SIG_UNBLOCK, &just_this, nullptr);
  raise(signal);
  std::_Exit(128 + signal);  // not reached: the default action of these three ends the process
}

}  // namespace

void remove_folders_on_interrupt() {
  const sigset_t set = interrupt_signals();
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;  // then signals act as before
  std::thread(wait_and_clean_up, set).detach();
}

void add_interrupt_folder(const std::filesystem::path& folder) {
  const std::lock_guard lock(folders_mutex);
  folders.push_back(folder);
}

void remove_interrupt_folder(const std::filesystem::path& folder) {
  const std::lock_guard lock(folders_mutex);
  folders.erase(std::remove(folders.begin(), folders.end(), folder), folders.end());
}

}  // namespace gmjit::bench
