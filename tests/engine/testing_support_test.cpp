// The test-support library: what it compiles must compile without a GPU.
#include <gtest/gtest.h>

#include "codegen/nvrtc_compiler.hpp"
#include "testing/device_random.hpp"

namespace gmjit {
namespace {

TEST(TestingSupport, FillRandomKernelCompilesForEveryTunedArch) {
  const codegen::KernelSource source = testing::fill_random_kernel_source();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    EXPECT_GT(codegen::compile_to_cubin(source, arch, "test").cubin.size(), 100u) << arch;
  }
}

}  // namespace
}  // namespace gmjit
