// The installed C++ API: an engine compiles a plan for Hopper without a GPU (NVRTC and the
// embedded kernel templates found from the installed library), and a bad layer is an Error.
#include <gmjit/gmjit.hpp>

#include <cstdio>

int main() {
  gmjit::Engine engine(gmjit::EngineOptions{.use_disk_cache = false});
  gmjit::LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 256;
  const gmjit::PreparedPlanInfo plan =
      engine.prepare(layer, gmjit::Recipe::bf16(), gmjit::GradMode::no_grad, "sm_90a");
  if (plan.kernel_names.empty()) {
    std::fprintf(stderr, "the plan has no kernels\n");
    return 1;
  }
  layer.hidden = 100;  // not a multiple of 8
  try {
    engine.prepare(layer, gmjit::Recipe::bf16(), gmjit::GradMode::no_grad, "sm_90a");
    std::fprintf(stderr, "hidden = 100 was accepted\n");
    return 1;
  } catch (const gmjit::Error& error) {
    if (error.status() != gmjit::Status::invalid_argument) {
      std::fprintf(stderr, "hidden = 100: %s\n", error.what());
      return 1;
    }
  }
  std::printf("C++ consumer ok (%zu kernels)\n", plan.kernel_names.size());
  return 0;
}
