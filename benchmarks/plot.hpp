#pragma once
// Plots of bench reports drawn by gnuplot (PNG): the cold/warm phases per shape (log scale) and,
// for GPU runs, forward and forward+backward TFLOP/s per shape beside torch's when the report
// carries them (bench --reference).
#include <span>
#include <string>

#include <nlohmann/json.hpp>

namespace gmjit::bench {

// Returns false (after saying why on stderr) when gnuplot is missing or fails.
bool write_plot(std::span<const nlohmann::json> reports, const std::string& png_path);

}  // namespace gmjit::bench
