// gmjit._C: the engine for Python. One engine per process, shared by every caller.
//
// Tensors cross as (data pointer, token count, device ordinal): the torch layer has already
// checked dtypes, shapes, devices and contiguity, and the shapes follow from the layer and T, so
// converting nine tensors through DLPack on every call (a Python __dlpack__ call and a capsule
// each) would cost more CPU than the rest of the call. `dlpack_refs` converts DLPack tensors the
// same way the C API does; the CPU-cost benchmark times both (docs/DECISIONS.md, "Python
// package").
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmjit/gmjit.hpp"

namespace nb = nanobind;

namespace {

// Never destroyed: at interpreter exit the CUDA primary contexts may already be gone (torch
// tears its state down in atexit hooks), and freeing device memory then fails or crashes. The
// process exit releases everything anyway.
gmjit::Engine& engine() {
  static gmjit::Engine* const instance = new gmjit::Engine();
  return *instance;
}

const gmjit::Recipe& bf16_recipe() {
  static const gmjit::Recipe recipe = gmjit::Recipe::bf16();
  return recipe;
}

// Recipes by the code gmjit.torch passes (the values of the C API's gmjit_recipe): 0 bf16,
// 1 fp8_block, 2 fp8_block with power-of-two scales, 3 fp8_tensor.
const gmjit::Recipe& recipe_of(int code) {
  static const gmjit::Recipe recipes[] = {gmjit::Recipe::bf16(), gmjit::Recipe::fp8_block(),
                                          gmjit::Recipe::fp8_block({.power_of_two_scales = true}),
                                          gmjit::Recipe::fp8_tensor()};
  if (code < 0 || code > 3) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'recipe': " + std::to_string(code) + " is not a recipe code");
  }
  return recipes[code];
}

// A layer description built once per option set by the Python layer and reused on every call.
struct Layer {
  gmjit::LayerSpec spec;
};

Layer make_layer(std::int64_t experts, std::int64_t hidden, std::int64_t ffn, int activation,
                 int glu_layout, float limit, float alpha, bool fc1_bias, bool fc2_bias,
                 bool router_probs, bool split_i64) {
  if (activation < 0 || activation > static_cast<int>(gmjit::Activation::relu)) {
    throw gmjit::Error(
        gmjit::Status::invalid_argument,
        "argument 'activation': " + std::to_string(activation) + " is not an activation code");
  }
  if (glu_layout != 0 && glu_layout != 1) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'glu_layout': " + std::to_string(glu_layout) +
                           " is not a GLU layout code (0 halves, 1 interleaved32)");
  }
  Layer layer;
  gmjit::LayerSpec& s = layer.spec;
  s.experts = experts;
  s.hidden = hidden;
  s.ffn = ffn;
  s.activation.kind = static_cast<gmjit::Activation>(activation);
  s.activation.layout =
      glu_layout == 1 ? gmjit::GluLayout::interleaved32 : gmjit::GluLayout::halves;
  s.activation.limit = limit;
  s.activation.alpha = alpha;
  s.fc1_bias = fc1_bias;
  s.fc2_bias = fc2_bias;
  s.router_probs = router_probs;
  s.split_dtype = split_i64 ? gmjit::DType::i64 : gmjit::DType::i32;
  return layer;
}

// A tensor the caller gave (address != 0) with the shape the layer implies; 0 means absent.
gmjit::TensorRef ref(std::uintptr_t address, gmjit::DType dtype,
                     std::initializer_list<std::int64_t> shape, gmjit::Device device) {
  if (address == 0) return {};
  return gmjit::make_tensor(reinterpret_cast<void*>(address), dtype, shape, device);
}

// The tensors of a forward besides the weights.
gmjit::ForwardArgs forward_args(const gmjit::LayerSpec& s, std::int64_t T, gmjit::Device dev,
                                std::uintptr_t x, std::uintptr_t split_sizes, std::uintptr_t b1,
                                std::uintptr_t b2, std::uintptr_t probs, std::uintptr_t y,
                                std::uintptr_t saved_preact) {
  using gmjit::DType;
  const std::int64_t E = s.experts, H = s.hidden, F1 = s.fc1_out();
  gmjit::ForwardArgs args;
  args.x = ref(x, DType::bf16, {T, H}, dev);
  args.split_sizes = ref(split_sizes, s.split_dtype, {E}, dev);
  args.b1 = ref(b1, DType::bf16, {E, F1}, dev);
  args.b2 = ref(b2, DType::bf16, {E, H}, dev);
  args.probs = ref(probs, DType::f32, {T}, dev);
  args.y = ref(y, DType::bf16, {T, H}, dev);
  args.saved_preact = ref(saved_preact, DType::bf16, {T, F1}, dev);
  return args;
}

// One FP8 weight of a recipe, [E, rows, cols] E4M3, and its fp32 scales: per 128 x 128 block
// (fp8_block), per expert matrix (fp8_tensor).
std::pair<gmjit::TensorRef, gmjit::TensorRef> fp8_weight(const gmjit::Recipe& recipe,
                                                         gmjit::Device dev, std::int64_t E,
                                                         std::int64_t rows, std::int64_t cols,
                                                         std::uintptr_t data,
                                                         std::uintptr_t scales) {
  using gmjit::DType;
  if (recipe.kind() == gmjit::RecipeKind::fp8_tensor) {
    return {ref(data, DType::f8e4m3, {E, rows, cols}, dev), ref(scales, DType::f32, {E}, dev)};
  }
  return {ref(data, DType::f8e4m3, {E, rows, cols}, dev),
          ref(scales, DType::f32, {E, rows / 128, cols / 128}, dev)};
}

// The weights of an FP8 recipe: E4M3 data and fp32 scales per 128 x 128 block (fp8_tensor: one
// per expert matrix).
struct Fp8Refs {
  gmjit::TensorRef w1, w1_scales, w2, w2_scales;
};

Fp8Refs fp8_refs(const gmjit::LayerSpec& s, const gmjit::Recipe& recipe, gmjit::Device dev,
                 std::uintptr_t w1_fp8, std::uintptr_t w1_scales, std::uintptr_t w2_fp8,
                 std::uintptr_t w2_scales) {
  const std::int64_t E = s.experts, H = s.hidden, F = s.ffn, F1 = s.fc1_out();
  const auto [w1, w1s] = fp8_weight(recipe, dev, E, F1, H, w1_fp8, w1_scales);
  const auto [w2, w2s] = fp8_weight(recipe, dev, E, H, F, w2_fp8, w2_scales);
  return {w1, w1s, w2, w2s};
}

// The transposed copies the FP8 data gradients read: w1t [E, H, F1], w2t [E, F, H] (0: absent;
// the engine wants all four or none).
Fp8Refs fp8_transposed_refs(const gmjit::LayerSpec& s, const gmjit::Recipe& recipe,
                            gmjit::Device dev, std::uintptr_t w1t_fp8, std::uintptr_t w1t_scales,
                            std::uintptr_t w2t_fp8, std::uintptr_t w2t_scales) {
  const std::int64_t E = s.experts, H = s.hidden, F = s.ffn, F1 = s.fc1_out();
  const auto [w1, w1s] = fp8_weight(recipe, dev, E, H, F1, w1t_fp8, w1t_scales);
  const auto [w2, w2s] = fp8_weight(recipe, dev, E, F, H, w2t_fp8, w2t_scales);
  return {w1, w1s, w2, w2s};
}

void run_forward(const gmjit::LayerSpec& s, const gmjit::Recipe& recipe,
                 const gmjit::ForwardArgs& args, std::uintptr_t stream) {
  const auto grad = args.saved_preact.present() ? gmjit::GradMode::grad : gmjit::GradMode::no_grad;
  // A cold call compiles for seconds: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  engine().forward(s, recipe, args, grad, reinterpret_cast<void*>(stream));
}

void forward(const Layer& layer, std::int64_t tokens, int device, std::uintptr_t x,
             std::uintptr_t split_sizes, std::uintptr_t w1, std::uintptr_t b1, std::uintptr_t w2,
             std::uintptr_t b2, std::uintptr_t probs, std::uintptr_t y, std::uintptr_t saved_preact,
             std::uintptr_t stream) {
  using gmjit::DType;
  const gmjit::LayerSpec& s = layer.spec;
  const gmjit::Device dev{gmjit::Device::Kind::cuda, device};
  const std::int64_t E = s.experts, H = s.hidden, F = s.ffn, F1 = s.fc1_out();
  gmjit::ForwardArgs args =
      forward_args(s, tokens, dev, x, split_sizes, b1, b2, probs, y, saved_preact);
  args.w1 = ref(w1, DType::bf16, {E, F1, H}, dev);
  args.w2 = ref(w2, DType::bf16, {E, H, F}, dev);
  run_forward(s, bf16_recipe(), args, stream);
}

// The forward of an FP8 recipe: the weights as quantize_weights wrote them; x is quantized by
// the forward itself.
void forward_fp8(const Layer& layer, int recipe, std::int64_t tokens, int device, std::uintptr_t x,
                 std::uintptr_t split_sizes, std::uintptr_t w1_fp8, std::uintptr_t w1_scales,
                 std::uintptr_t w2_fp8, std::uintptr_t w2_scales, std::uintptr_t b1,
                 std::uintptr_t b2, std::uintptr_t probs, std::uintptr_t y,
                 std::uintptr_t saved_preact, std::uintptr_t stream) {
  const gmjit::Recipe& r = recipe_of(recipe);
  const gmjit::LayerSpec& s = layer.spec;
  const gmjit::Device dev{gmjit::Device::Kind::cuda, device};
  gmjit::ForwardArgs args =
      forward_args(s, tokens, dev, x, split_sizes, b1, b2, probs, y, saved_preact);
  const Fp8Refs q = fp8_refs(s, r, dev, w1_fp8, w1_scales, w2_fp8, w2_scales);
  args.w1_fp8 = q.w1;
  args.w1_scales = q.w1_scales;
  args.w2_fp8 = q.w2;
  args.w2_scales = q.w2_scales;
  run_forward(s, r, args, stream);
}

void quantize_weights(const Layer& layer, int recipe, int device, std::uintptr_t w1,
                      std::uintptr_t w2, std::uintptr_t w1_fp8, std::uintptr_t w1_scales,
                      std::uintptr_t w2_fp8, std::uintptr_t w2_scales, std::uintptr_t stream,
                      std::uintptr_t w1t_fp8, std::uintptr_t w1t_scales, std::uintptr_t w2t_fp8,
                      std::uintptr_t w2t_scales) {
  using gmjit::DType;
  const gmjit::Recipe& r = recipe_of(recipe);
  const gmjit::LayerSpec& s = layer.spec;
  const gmjit::Device dev{gmjit::Device::Kind::cuda, device};
  const std::int64_t E = s.experts, H = s.hidden, F = s.ffn, F1 = s.fc1_out();
  const Fp8Refs q = fp8_refs(s, r, dev, w1_fp8, w1_scales, w2_fp8, w2_scales);
  gmjit::QuantizeWeightsArgs args;
  args.w1 = ref(w1, DType::bf16, {E, F1, H}, dev);
  args.w2 = ref(w2, DType::bf16, {E, H, F}, dev);
  args.w1_fp8 = q.w1;
  args.w1_scales = q.w1_scales;
  args.w2_fp8 = q.w2;
  args.w2_scales = q.w2_scales;
  const Fp8Refs t = fp8_transposed_refs(s, r, dev, w1t_fp8, w1t_scales, w2t_fp8, w2t_scales);
  args.w1t_fp8 = t.w1;
  args.w1t_scales = t.w1_scales;
  args.w2t_fp8 = t.w2;
  args.w2t_scales = t.w2_scales;
  nb::gil_scoped_release release;
  engine().quantize_weights(s, r, args, reinterpret_cast<void*>(stream));
}

void backward(const Layer& layer, std::int64_t tokens, int device, std::uintptr_t dy,
              std::uintptr_t x, std::uintptr_t split_sizes, std::uintptr_t w1, std::uintptr_t w2,
              std::uintptr_t b2, std::uintptr_t probs, std::uintptr_t saved_preact,
              std::uintptr_t dx, std::uintptr_t dw1, std::uintptr_t db1, std::uintptr_t dw2,
              std::uintptr_t db2, std::uintptr_t dprobs, bool accumulate, std::uintptr_t stream,
              int recipe, bool bf16_weight_grads, std::uintptr_t w1t_fp8, std::uintptr_t w1t_scales,
              std::uintptr_t w2t_fp8, std::uintptr_t w2t_scales) {
  using gmjit::DType;
  // The forward's recipe (its context's options_key). With the transposed FP8 weights given, an
  // FP8 recipe runs the data gradients in FP8, and the weight gradients where faster
  // (EngineOptions::fp8_weight_grads).
  const gmjit::Recipe& r = recipe_of(recipe);
  const gmjit::LayerSpec& s = layer.spec;
  const gmjit::Device dev{gmjit::Device::Kind::cuda, device};
  const std::int64_t T = tokens, E = s.experts, H = s.hidden, F = s.ffn, F1 = s.fc1_out();
  // The context a grad-enabled forward of this layer returned: it is a plain value, so the
  // torch layer keeps the tensors and this rebuilds it, with the recipe it was given (so the
  // engine's recipe check cannot catch a wrong one here: the torch layer passes the forward's).
  const gmjit::ForwardContext context{s,
                                      gmjit::GradMode::grad,
                                      r.options_key(),
                                      T,
                                      dev,
                                      reinterpret_cast<const void*>(saved_preact)};
  gmjit::BackwardArgs args;
  args.dy = ref(dy, DType::bf16, {T, H}, dev);
  args.x = ref(x, DType::bf16, {T, H}, dev);
  args.split_sizes = ref(split_sizes, s.split_dtype, {E}, dev);
  args.w1 = ref(w1, DType::bf16, {E, F1, H}, dev);
  args.w2 = ref(w2, DType::bf16, {E, H, F}, dev);
  args.b2 = ref(b2, DType::bf16, {E, H}, dev);
  args.probs = ref(probs, DType::f32, {T}, dev);
  args.saved_preact = ref(saved_preact, DType::bf16, {T, F1}, dev);
  args.dx = ref(dx, DType::bf16, {T, H}, dev);
  // dW1, dW2 in bf16 (the weights' dtype) or fp32.
  const DType weight_grad = bf16_weight_grads ? DType::bf16 : DType::f32;
  args.dw1 = ref(dw1, weight_grad, {E, F1, H}, dev);
  args.db1 = ref(db1, DType::f32, {E, F1}, dev);
  args.dw2 = ref(dw2, weight_grad, {E, H, F}, dev);
  args.db2 = ref(db2, DType::f32, {E, H}, dev);
  args.dprobs = ref(dprobs, DType::f32, {T}, dev);
  args.accumulate = accumulate;
  const Fp8Refs t = fp8_transposed_refs(s, r, dev, w1t_fp8, w1t_scales, w2t_fp8, w2t_scales);
  args.w1t_fp8 = t.w1;
  args.w1t_scales = t.w1_scales;
  args.w2t_fp8 = t.w2;
  args.w2t_scales = t.w2_scales;
  nb::gil_scoped_release release;
  engine().backward(context, r, args, reinterpret_cast<void*>(stream));
}

std::vector<std::string> prepare(const Layer& layer, bool grad, const std::string& arch,
                                 int recipe) {
  const gmjit::Recipe& r = recipe_of(recipe);
  nb::gil_scoped_release release;
  return engine()
      .prepare(layer.spec, r, grad ? gmjit::GradMode::grad : gmjit::GradMode::no_grad, arch)
      .kernel_names;
}

std::vector<std::string> prepare_backward(const Layer& layer, const std::string& arch, int recipe,
                                          bool dx, bool dw1, bool db1, bool dw2, bool db2,
                                          bool bf16_weight_grads, bool fp8_transposed_weights) {
  const gmjit::Recipe& r = recipe_of(recipe);
  const gmjit::GradientSet gradients{dx, dw1, db1, dw2, db2, bf16_weight_grads};
  nb::gil_scoped_release release;
  return engine()
      .prepare_backward(layer.spec, r, gradients, arch, fp8_transposed_weights)
      .kernel_names;
}

std::vector<std::string> prepare_weight_quantizer(const Layer& layer, int recipe, bool transposed,
                                                  const std::string& arch) {
  const gmjit::Recipe& r = recipe_of(recipe);
  nb::gil_scoped_release release;
  return engine().prepare_weight_quantizer(layer.spec, r, transposed, arch).kernel_names;
}

nb::dict counters() {
  gmjit::EngineCounters c;
  {
    nb::gil_scoped_release release;  // the first call makes the engine (cache set-up)
    c = engine().counters();
  }
  nb::dict d;
  d["plans_built"] = c.plans_built;
  d["forward_plans_built"] = c.forward_plans_built;
  d["backward_plans_built"] = c.backward_plans_built;
  d["kernels_compiled"] = c.kernels_compiled;
  d["nvrtc_seconds"] = c.nvrtc_seconds;
  d["disk_reads"] = c.disk_reads;
  d["disk_shared_reads"] = c.disk_shared_reads;  // of disk_reads: from GMJIT_CACHE_SHARED_DIR
  d["disk_writes"] = c.disk_writes;
  d["memory_hits"] = c.memory_hits;
  d["workspace_bytes"] = c.workspace_bytes;
  return d;
}

nb::list devices() {
  std::vector<gmjit::DeviceInfo> infos;
  {
    nb::gil_scoped_release release;  // the first call loads the driver (cuInit)
    infos = gmjit::Engine::devices();
  }
  nb::list out;
  for (const gmjit::DeviceInfo& info : infos) {
    nb::dict d;
    d["ordinal"] = info.ordinal;
    d["name"] = info.name;
    d["arch"] = info.arch;
    d["multiprocessors"] = info.multiprocessors;
    d["memory_bytes"] = info.memory_bytes;
    out.append(d);
  }
  return out;
}

std::pair<bool, std::string> driver_available() {
  std::string why;
  nb::gil_scoped_release release;  // the first call loads the driver (cuInit)
  const bool ok = gmjit::Engine::driver_available(&why);
  return {ok, why};
}

// DLPack tensors to TensorRefs, as the C API converts them: what a DLPack-based binding would pay
// per call. Returns the element counts so the work cannot be skipped.
std::int64_t dlpack_refs(const std::vector<nb::ndarray<nb::c_contig>>& tensors) {
  std::int64_t total = 0;
  for (const auto& t : tensors) {
    gmjit::TensorRef r;
    r.data = t.data();
    r.ndim = static_cast<int>(t.ndim());
    for (std::size_t i = 0; i < t.ndim() && i < 4; ++i) r.shape[i] = t.shape(i);
    r.device = {t.device_type() == nb::device::cuda::value ? gmjit::Device::Kind::cuda
                                                           : gmjit::Device::Kind::cpu,
                t.device_id()};
    total += r.numel();
  }
  return total;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "gmjit engine bindings (use gmjit.torch for tensors)";
  // gmjit.torch keeps its Layer objects in a module-level cache until the interpreter exits;
  // nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  static nb::exception<gmjit::Error> error(m, "Error", PyExc_RuntimeError);
  // Invalid arguments are ValueErrors, as Python callers expect; everything else is gmjit.Error
  // (a RuntimeError) with the status name in front of the engine's message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gmjit::Error& e) {
      if (e.status() == gmjit::Status::invalid_argument) {
        PyErr_SetString(PyExc_ValueError, e.what());
      } else {
        const std::string message = std::string(gmjit::status_name(e.status())) + ": " + e.what();
        PyErr_SetString(error.ptr(), message.c_str());
      }
    }
  });

  nb::class_<Layer>(m, "Layer")
      .def(
          "__init__",
          [](Layer* self, std::int64_t experts, std::int64_t hidden, std::int64_t ffn,
             int activation, int glu_layout, float limit, float alpha, bool fc1_bias, bool fc2_bias,
             bool router_probs, bool split_i64) {
            new (self) Layer(make_layer(experts, hidden, ffn, activation, glu_layout, limit, alpha,
                                        fc1_bias, fc2_bias, router_probs, split_i64));
          },
          nb::arg("experts"), nb::arg("hidden"), nb::arg("ffn"), nb::arg("activation"),
          nb::arg("glu_layout"), nb::arg("limit"), nb::arg("alpha"), nb::arg("fc1_bias"),
          nb::arg("fc2_bias"), nb::arg("router_probs"), nb::arg("split_i64"))
      .def("describe", [](const Layer& l) { return l.spec.describe(); })
      .def_prop_ro("fc1_out", [](const Layer& l) { return l.spec.fc1_out(); })
      .def("__repr__", [](const Layer& l) { return "gmjit._C.Layer(" + l.spec.describe() + ")"; });

  m.def("forward", &forward, nb::arg("layer"), nb::arg("tokens"), nb::arg("device"), nb::arg("x"),
        nb::arg("split_sizes"), nb::arg("w1"), nb::arg("b1"), nb::arg("w2"), nb::arg("b2"),
        nb::arg("probs"), nb::arg("y"), nb::arg("saved_preact"), nb::arg("stream"),
        "Forward on `stream`; tensors are data pointers (0: absent). A non-zero saved_preact "
        "makes it a grad-enabled forward.");
  m.def("backward", &backward, nb::arg("layer"), nb::arg("tokens"), nb::arg("device"),
        nb::arg("dy"), nb::arg("x"), nb::arg("split_sizes"), nb::arg("w1"), nb::arg("w2"),
        nb::arg("b2"), nb::arg("probs"), nb::arg("saved_preact"), nb::arg("dx"), nb::arg("dw1"),
        nb::arg("db1"), nb::arg("dw2"), nb::arg("db2"), nb::arg("dprobs"), nb::arg("accumulate"),
        nb::arg("stream"), nb::arg("recipe") = 0, nb::arg("bf16_weight_grads") = false,
        nb::arg("w1t_fp8") = 0, nb::arg("w1t_scales") = 0, nb::arg("w2t_fp8") = 0,
        nb::arg("w2t_scales") = 0,
        "Backward of a grad-enabled forward; gradients given as 0 are not computed. `recipe` "
        "is the forward's recipe code (0 bf16, 1 fp8_block, 2 fp8_block_pow2, 3 fp8_tensor); "
        "bf16_weight_grads: dw1 and dw2 are bf16 (no accumulation), else fp32. w1t_fp8 ... "
        "w2t_scales: the transposed FP8 weights quantize_weights wrote (all four or none): "
        "given, an FP8 recipe runs the data gradients in FP8 and w1, w2 are not read.");
  m.def("forward_fp8", &forward_fp8, nb::arg("layer"), nb::arg("recipe"), nb::arg("tokens"),
        nb::arg("device"), nb::arg("x"), nb::arg("split_sizes"), nb::arg("w1_fp8"),
        nb::arg("w1_scales"), nb::arg("w2_fp8"), nb::arg("w2_scales"), nb::arg("b1"), nb::arg("b2"),
        nb::arg("probs"), nb::arg("y"), nb::arg("saved_preact"), nb::arg("stream"),
        "Forward of an FP8 recipe (code 1, 2 or 3) from quantized weights; tensors are data "
        "pointers (0: absent). A non-zero saved_preact makes it a grad-enabled forward.");
  m.def("quantize_weights", &quantize_weights, nb::arg("layer"), nb::arg("recipe"),
        nb::arg("device"), nb::arg("w1"), nb::arg("w2"), nb::arg("w1_fp8"), nb::arg("w1_scales"),
        nb::arg("w2_fp8"), nb::arg("w2_scales"), nb::arg("stream"), nb::arg("w1t_fp8") = 0,
        nb::arg("w1t_scales") = 0, nb::arg("w2t_fp8") = 0, nb::arg("w2t_scales") = 0,
        "Writes the E4M3 weights and fp32 scales of an FP8 recipe from bf16 w1, w2; with "
        "w1t_fp8 ... w2t_scales (all four or none: 0) also their transposed copies "
        "([E, H, F1], [E, F, H]) for the backward's FP8 data gradients.");
  m.def("prepare", &prepare, nb::arg("layer"), nb::arg("grad"), nb::arg("arch"),
        nb::arg("recipe") = 0,
        "Compiles (or loads from the caches) the forward plan's kernels for `arch`; no GPU "
        "needed. Returns the kernel names.");
  m.def("prepare_backward", &prepare_backward, nb::arg("layer"), nb::arg("arch"), nb::arg("recipe"),
        nb::arg("dx"), nb::arg("dw1"), nb::arg("db1"), nb::arg("dw2"), nb::arg("db2"),
        nb::arg("bf16_weight_grads"), nb::arg("fp8_transposed_weights"),
        "Compiles (or loads) the backward plan of these gradients for `arch`; no GPU needed. "
        "bf16_weight_grads: dw1 / dw2 written in bf16 (backward's bf16_weight_grads); "
        "fp8_transposed_weights: an FP8 recipe's backward given the transposed FP8 weights. "
        "Returns the kernel names.");
  m.def("prepare_weight_quantizer", &prepare_weight_quantizer, nb::arg("layer"), nb::arg("recipe"),
        nb::arg("transposed"), nb::arg("arch"),
        "Compiles (or loads) an FP8 recipe's weight quantizers (with the transposed copies "
        "when `transposed`) for `arch`. Returns the kernel names.");
  m.def("counters", &counters, "The engine's counters as a dict.");
  m.def("devices", &devices,
        "CUDA devices the driver sees (an empty list without a driver); device queries only, "
        "no context is made on any of them.");
  m.def("driver_available", &driver_available, "(available, why not)");
  m.def("cache_directory", [] { return engine().cache_directory(); });
  m.def("nvrtc_version", &gmjit::nvrtc_version);
  m.def("supported_arches", &gmjit::supported_arches,
        "The arches gmjit generates kernels for (what prepare takes).");
  m.def("dlpack_refs", &dlpack_refs, nb::arg("tensors"),
        "Converts DLPack tensors like the C API does (for timing the DLPack path).");
}
