#pragma once
// Plots of bench reports drawn by gnuplot (PNG): the cold/warm phases per shape (log scale) and,
// for GPU runs, forward and forward+backward TFLOP/s per shape beside torch's when the report
// carries them (bench --reference).
#include <span>
#include <string>

#include <nlohmann/json.hpp>

namespace gmjit::bench {

// A JSON value as an error message shows it: scalars as JSON (long ones cut), containers by kind
// and size (never dumped: a deeply nested one would overflow the serializer's stack).
std::string shown(const nlohmann::json& value);

// Throws Error(invalid_argument) naming the field when `report` is not a bench report the plot
// can draw: an object whose "arch" (if any) is a supported arch and whose "preset" (if any) is a
// name of letters, digits and - _ . + (it becomes a column of gnuplot's data file).
void check_plot_report(const nlohmann::json& report);

// Checks every report first (check_plot_report). Returns false (after saying why on stderr) when
// gnuplot is missing or fails.
bool write_plot(std::span<const nlohmann::json> reports, const std::string& png_path);

}  // namespace gmjit::bench
