#pragma once
// CUDA graph capture for the GPU tests: an owned non-blocking stream and a captured, instantiated
// graph (RAII), as torch.cuda.graph uses them.
#include <functional>

#include "engine/runtime/driver.hpp"

namespace gmjit::testing {

inline const engine::DriverApi& api() {
  return engine::driver();
}

inline void check(CUresult rc, const char* call) {
  engine::check_driver(rc, call);
}

// An owned non-blocking stream (what torch.cuda.graph captures on) of device 0.
struct Stream {
  CUstream handle = nullptr;
  Stream() { check(api().cuStreamCreate(&handle, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); }
  ~Stream() { api().cuStreamDestroy(handle); }
  void synchronize() const { check(api().cuStreamSynchronize(handle), "cuStreamSynchronize"); }
};

// Captures `work` on `stream` in global mode (the strictest, and torch's default) and
// instantiates it.
struct CapturedGraph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CapturedGraph(CUstream stream, const std::function<void()>& work) {
    check(api().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
          "cuStreamBeginCapture");
    work();
    check(api().cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    check(api().cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  }
  ~CapturedGraph() {
    if (exec) api().cuGraphExecDestroy(exec);
    if (graph) api().cuGraphDestroy(graph);
  }
  void replay(CUstream stream, int times) const {
    for (int i = 0; i < times; ++i) check(api().cuGraphLaunch(exec, stream), "cuGraphLaunch");
  }
};

}  // namespace gmjit::testing
