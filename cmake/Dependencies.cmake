# Every dependency comes from a Debian package; nothing is downloaded at configure time.
find_package(CUDAToolkit 12.8 REQUIRED)   # NVRTC and cuda.h; the driver itself is dlopen'ed
find_package(fmt REQUIRED)
# The CLI and the bench harness only. A wheel (GMJIT_BUILD_PYTHON) carries the CLI where both
# are found and goes without it otherwise (`gmjit` then says how it was built).
if(GMJIT_BUILD_PYTHON)
  find_package(CLI11 QUIET)
  find_package(nlohmann_json QUIET)
else()
  find_package(CLI11 REQUIRED)
  find_package(nlohmann_json REQUIRED)
endif()
find_package(Threads REQUIRED)

# xxHash is used header-only (XXH_INLINE_ALL) so the library has no runtime dependency on it.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
add_library(gmjit_xxhash INTERFACE)
target_include_directories(gmjit_xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_compile_definitions(gmjit_xxhash INTERFACE XXH_INLINE_ALL)

find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)
add_library(gmjit_dlpack INTERFACE)
target_include_directories(gmjit_dlpack SYSTEM INTERFACE ${DLPACK_INCLUDE_DIR})
