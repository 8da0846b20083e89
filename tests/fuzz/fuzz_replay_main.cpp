// Runs LLVMFuzzerTestOneInput without libFuzzer (any compiler): over the files named on the
// command line, or, with no arguments, over built-in seeds and deterministic mutations of them.
// `--write-seeds DIR` writes the seeds as a starting corpus for the libFuzzer binary.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entry_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

void run(const std::vector<std::uint8_t>& input) {
  LLVMFuzzerTestOneInput(input.data(), input.size());
}

std::vector<std::vector<std::uint8_t>> seeds() {
  using namespace gmjit::cache;
  std::vector<std::vector<std::uint8_t>> out;
  const std::vector<std::byte> payload(300, std::byte{0x5a});
  for (const EntryLabels& labels :
       {EntryLabels{}, EntryLabels{"0123abcd", "grad", "sm_90a", "kernel"}}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, payload.size()}) {
      const std::vector<std::byte> bytes =
          encode(Key128{1, 2}, labels, std::span(payload).first(n));
      std::vector<std::uint8_t> seed;
      for (std::byte b : bytes) seed.push_back(std::to_integer<std::uint8_t>(b));
      out.push_back(std::move(seed));
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--write-seeds") {
    int n = 0;
    for (const std::vector<std::uint8_t>& seed : seeds()) {
      std::ofstream out(std::string(argv[2]) + "/seed-" + std::to_string(n++), std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.data()),
                static_cast<std::streamsize>(seed.size()));
    }
    std::printf("wrote %d seeds to %s\n", n, argv[2]);
    return 0;
  }
  if (argc > 1) {
    for (int i = 1; i < argc; ++i) {
      std::ifstream in(argv[i], std::ios::binary);
      run(std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {}));
    }
    std::printf("replayed %d inputs\n", argc - 1);
    return 0;
  }
  std::mt19937_64 rng(7);
  std::size_t count = 0;
  for (const std::vector<std::uint8_t>& seed : seeds()) {
    run(seed);
    for (int i = 0; i < 5000; ++i, ++count) {
      std::vector<std::uint8_t> input = seed;
      for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
        const std::uint64_t r = rng();
        if (r % 3 == 0 && !input.empty()) {
          input[r / 3 % input.size()] ^= static_cast<std::uint8_t>(1u << (r >> 40 & 7));
        } else if (r % 3 == 1) {
          input.resize(r / 3 % (input.size() + 1));
        } else if (!input.empty()) {
          input[r / 3 % input.size()] = static_cast<std::uint8_t>(r >> 48);
        }
      }
      run(input);
    }
  }
  std::printf("ran %zu mutated inputs\n", count);
  return 0;
}
