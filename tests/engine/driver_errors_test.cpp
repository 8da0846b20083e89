// Driver errors say what failed; in a forked child they also say why CUDA cannot work there.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <string>

#include "engine/runtime/driver.hpp"
#include "gmjit/error.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {
namespace {

std::string message_of(CUresult result) {
  try {
    check_driver(result, "cuCtxPushCurrent");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

constexpr const char* kForkNote = "a fork of the one that initialised CUDA";

// `gmjit doctor` prints it: "major.minor" of a loaded driver, empty without one.
TEST(DriverVersion, IsMajorDotMinorWhereADriverLoadsAndEmptyElsewhere) {
  const std::string version = gmjit::driver_version();
  if (driver_available()) {
    EXPECT_TRUE(std::regex_match(version, std::regex("[1-9][0-9]*\\.[0-9]+"))) << version;
  } else {
    EXPECT_EQ(version, "");
  }
}

TEST(DriverErrors, NameTheCallAndOnlyInAForkedChildTheFork) {
  driver_available();  // the driver is loaded (or found missing) by this process
  const std::string here = message_of(CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_NE(here.find("cuCtxPushCurrent failed"), std::string::npos) << here;
  EXPECT_EQ(here.find(kForkNote), std::string::npos) << here;

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string there = message_of(CUDA_ERROR_NOT_INITIALIZED);
    _exit(there.find(kForkNote) != std::string::npos && there.find("spawn") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's message lacks the fork note";
}

}  // namespace
}  // namespace gmjit::engine
