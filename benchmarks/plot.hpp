#pragma once
// `gmjit bench --plot FILE.png`: the phases (and, from a GPU run, throughput) drawn by gnuplot.
#include <string>

#include <nlohmann/json.hpp>

namespace gmjit::bench {

// Returns false (after saying why on stderr) when gnuplot is missing or fails.
bool write_plot(const nlohmann::json& report, const std::string& png_path);

}  // namespace gmjit::bench
