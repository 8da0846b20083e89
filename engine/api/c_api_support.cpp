// The C API's shared parts: status and enum conversions, the thread's last error, the version.
#include <cstring>
#include <initializer_list>
#include <string>

#include <fmt/format.h>

#include "engine/api/c_api_support.hpp"

namespace gmjit::engine::c_api {
namespace {

// The C enums spell the C++ ones with the same values, so that conversions are casts. Each
// switch below gives a C++ enumerator's C spelling (-Wswitch makes a new C++ enumerator without
// one an error; anything else gives -1); the static_asserts check that the values agree.
constexpr int c_status(gmjit::Status status) {
  switch (status) {
    case gmjit::Status::ok:
      return GMJIT_OK;
    case gmjit::Status::invalid_argument:
      return GMJIT_INVALID_ARGUMENT;
    case gmjit::Status::unsupported:
      return GMJIT_UNSUPPORTED;
    case gmjit::Status::no_device:
      return GMJIT_NO_DEVICE;
    case gmjit::Status::compile_failed:
      return GMJIT_COMPILE_FAILED;
    case gmjit::Status::driver_error:
      return GMJIT_DRIVER_ERROR;
    case gmjit::Status::internal:
      return GMJIT_INTERNAL;
  }
  return -1;
}

constexpr int c_activation(gmjit::Activation activation) {
  switch (activation) {
    case gmjit::Activation::swiglu:
      return GMJIT_SWIGLU;
    case gmjit::Activation::geglu:
      return GMJIT_GEGLU;
    case gmjit::Activation::clamped_swiglu:
      return GMJIT_CLAMPED_SWIGLU;
    case gmjit::Activation::srelu:
      return GMJIT_SRELU;
    case gmjit::Activation::gelu:
      return GMJIT_GELU;
    case gmjit::Activation::relu:
      return GMJIT_RELU;
  }
  return -1;
}

constexpr int c_glu_layout(gmjit::GluLayout layout) {
  switch (layout) {
    case gmjit::GluLayout::halves:
      return GMJIT_GLU_HALVES;
    case gmjit::GluLayout::interleaved32:
      return GMJIT_GLU_INTERLEAVED32;
  }
  return -1;
}

template <typename Cpp>
constexpr bool same_values(int (*to_c)(Cpp), std::initializer_list<Cpp> all) {
  for (Cpp value : all) {
    if (to_c(value) != static_cast<int>(value)) return false;
  }
  return true;
}

static_assert(same_values(c_status, {gmjit::Status::ok, gmjit::Status::invalid_argument,
                                     gmjit::Status::unsupported, gmjit::Status::no_device,
                                     gmjit::Status::compile_failed, gmjit::Status::driver_error,
                                     gmjit::Status::internal}));
static_assert(same_values(c_activation,
                          {gmjit::Activation::swiglu, gmjit::Activation::geglu,
                           gmjit::Activation::clamped_swiglu, gmjit::Activation::srelu,
                           gmjit::Activation::gelu, gmjit::Activation::relu}));
static_assert(same_values(c_glu_layout,
                          {gmjit::GluLayout::halves, gmjit::GluLayout::interleaved32}));

// The C++ value of a C enum field, or an invalid_argument error naming it. A value is valid
// when the C++ enumerator with that number maps back to it.
// The field is read as its underlying integer: a caller may store any int there, and loading
// an out-of-range value as the enum type itself is undefined behaviour in C++.
template <typename Cpp, typename C>
Cpp from_c(const C& field, int (*to_c)(Cpp), const char* name) {
  static_assert(sizeof(C) == sizeof(int), "C API enums are int-sized");
  int number = 0;
  std::memcpy(&number, &field, sizeof number);
  if (number < 0 || number > 255 || to_c(static_cast<Cpp>(number)) != number) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument '{}': {} is not a valid value", name, number));
  }
  return static_cast<Cpp>(number);
}

constexpr int c_fp8_weight_grads(Fp8WeightGrads policy) {
  switch (policy) {
    case Fp8WeightGrads::automatic:
      return GMJIT_FP8_WGRAD_AUTO;
    case Fp8WeightGrads::fp8:
      return GMJIT_FP8_WGRAD_FP8;
    case Fp8WeightGrads::bf16:
      return GMJIT_FP8_WGRAD_BF16;
  }
  return -1;
}
static_assert(same_values(c_fp8_weight_grads,
                          {Fp8WeightGrads::automatic, Fp8WeightGrads::fp8, Fp8WeightGrads::bf16}));

thread_local std::string last_error;
// Static text reported instead of last_error when the message could not be stored (out of
// memory): recording an error must never throw out of an extern "C" function.
thread_local const char* last_error_fallback = nullptr;

}  // namespace

void set_last_error(const char* message) noexcept {
  try {
    last_error.assign(message);
    last_error_fallback = nullptr;
  } catch (const std::exception&) {  // bad_alloc / length_error from the copy
    last_error.clear();
    last_error_fallback = "gmjit: out of memory while recording the error message";
  }
}

const char* last_error_text() noexcept {
  return last_error_fallback != nullptr ? last_error_fallback : last_error.c_str();
}

gmjit_status status_to_c(Status status) noexcept {
  return static_cast<gmjit_status>(c_status(status));
}

// The recipe of a gmjit_recipe field (read as its underlying integer, as from_c does).
Recipe recipe_from_c(const gmjit_recipe& field) {
  static_assert(sizeof(gmjit_recipe) == sizeof(int), "C API enums are int-sized");
  int number = 0;
  std::memcpy(&number, &field, sizeof number);
  switch (number) {
    case GMJIT_RECIPE_BF16:
      return gmjit::Recipe::bf16();
    case GMJIT_RECIPE_FP8_BLOCK:
      return gmjit::Recipe::fp8_block();
    case GMJIT_RECIPE_FP8_BLOCK_POW2:
      return gmjit::Recipe::fp8_block({.power_of_two_scales = true});
    case GMJIT_RECIPE_FP8_TENSOR:
      return gmjit::Recipe::fp8_tensor();
    default:
      // std::to_string, not fmt: GCC 13's -Warray-bounds misfires on fmt's digit copy here.
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "argument 'recipe': " + std::to_string(number) + " is not a valid value");
  }
}

Fp8WeightGrads fp8_weight_grads_from_c(const gmjit_fp8_weight_grads& field, const char* name) {
  return from_c<Fp8WeightGrads>(field, c_fp8_weight_grads, name);
}

// The layer description without the flags that follow from the call's optional tensors.
LayerSpec convert_layer(const gmjit_layer& layer) {
  gmjit::LayerSpec spec;
  spec.experts = layer.experts;
  spec.hidden = layer.hidden;
  spec.ffn = layer.ffn;
  spec.activation.kind =
      from_c<gmjit::Activation>(layer.activation, c_activation, "layer.activation");
  spec.activation.layout =
      from_c<gmjit::GluLayout>(layer.glu_layout, c_glu_layout, "layer.glu_layout");
  spec.activation.limit = layer.clamp_limit;
  spec.activation.alpha = layer.clamp_alpha;
  return spec;
}

void check_struct_size(std::size_t size, std::size_t expected, const char* argument,
                       const char* init_function) {
  if (size != expected) {
    throw Error(Status::invalid_argument,
                fmt::format("argument '{}': struct_size is {}, expected {} (fill the struct with "
                            "{} of this version's gmjit.h)",
                            argument, size, expected, init_function));
  }
}

}  // namespace gmjit::engine::c_api

extern "C" {

const char* gmjit_last_error(void) {
  return gmjit::engine::c_api::last_error_text();
}

static_assert(GMJIT_VERSION_MAJOR == GMJIT_PROJECT_VERSION_MAJOR &&
                  GMJIT_VERSION_MINOR == GMJIT_PROJECT_VERSION_MINOR &&
                  GMJIT_VERSION_PATCH == GMJIT_PROJECT_VERSION_PATCH,
              "gmjit.h's GMJIT_VERSION_* must match project(gmjit VERSION ...) in CMakeLists.txt");

int gmjit_version(void) {
  return GMJIT_VERSION;
}

const char* gmjit_status_string(gmjit_status status) {
  return gmjit::status_name(static_cast<gmjit::Status>(status));
}

}  // extern "C"
