// What the C API's translation units share: the handles behind its opaque types, the one error
// idiom (guarded: exceptions to status codes and the thread's last error) and the conversions of
// its enums and layer struct. Internal: not installed.
#pragma once

#include <exception>
#include <string>

#include "gmjit/gmjit.h"
#include "gmjit/gmjit.hpp"

struct gmjit_engine {
  explicit gmjit_engine(gmjit::EngineOptions options = {})
      : engine(options), cache_directory(engine.cache_directory()) {}
  gmjit::Engine engine;
  const std::string cache_directory;  // fixed for the engine's life (gmjit_engine_cache_directory)
};

struct gmjit_forward_context {
  gmjit::ForwardContext context;
  gmjit::Recipe recipe = gmjit::Recipe::bf16();  // the forward's: its backward uses it too
};

namespace gmjit::engine::c_api {

// This thread's last error (gmjit_last_error); never throws.
void set_last_error(const char* message) noexcept;
const char* last_error_text() noexcept;
gmjit_status status_to_c(Status status) noexcept;

// Every extern "C" entry goes through here: nothing may unwind into C callers.
template <typename Body>
gmjit_status guarded(Body&& body) noexcept {
  try {
    body();
    set_last_error("");
    return GMJIT_OK;
  } catch (const Error& error) {
    set_last_error(error.what());
    return status_to_c(error.status());
  } catch (const std::exception& error) {
    set_last_error(error.what());
    return GMJIT_INTERNAL;
  } catch (...) {
    set_last_error("internal error: an exception not derived from std::exception");
    return GMJIT_INTERNAL;
  }
}

// An invalid_argument error naming `name` when `pointer` is null.
inline void require(const void* pointer, const char* name) {
  if (pointer == nullptr) {
    throw Error(Status::invalid_argument, std::string("argument '") + name + "' must not be null");
  }
}

// The C enums' values, or an invalid_argument error naming `name` (the fields are read as their
// underlying integers: a caller may store any int there).
Recipe recipe_from_c(const gmjit_recipe& field);
Fp8WeightGrads fp8_weight_grads_from_c(const gmjit_fp8_weight_grads& field, const char* name);

// The layer description without the flags that follow from a call's optional tensors.
LayerSpec convert_layer(const gmjit_layer& layer);

// An error naming `argument` unless `size` (its struct_size) is `expected`: a struct not filled by
// `init_function`, or one of another header version.
void check_struct_size(std::size_t size, std::size_t expected, const char* argument,
                       const char* init_function);

}  // namespace gmjit::engine::c_api
