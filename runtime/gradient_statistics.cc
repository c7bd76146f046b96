#include "runtime/gradient_statistics.h"

#include <cmath>

namespace actpack::runtime {

void GradientStatistics::Set(const std::map<std::string, ModuleGradients>& gradients) {
  gradients_ = gradients;
  ++version_;
  weight_.clear();
  double sum = 0;
  size_t count = 0;
  for (const auto& [module, g] : gradients) {
    if (std::isfinite(g.params_sq) && g.params_sq > 0) {
      sum += g.params_sq;
      ++count;
    }
  }
  if (count == 0) return;
  const double mean = sum / static_cast<double>(count);
  for (const auto& [module, g] : gradients) {
    if (std::isfinite(g.params_sq) && g.params_sq > 0) {
      weight_[module] = 0.5 + 0.5 * g.params_sq / mean;
    }
  }
}

double GradientStatistics::WeightOf(const std::string& module) const {
  std::string name = module;
  while (true) {
    auto it = weight_.find(name);
    if (it != weight_.end()) return it->second;
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) break;
    name.resize(dot);
  }
  return 1.0;
}

ErrorCap GradientStatistics::CapFor(const std::string& module, uint64_t numel,
                                    double mean_square, double allowed_loss_increase) const {
  const double e = allowed_loss_increase;
  ErrorCap cap{e / 2, "relative"};
  auto it = gradients_.find(module);
  if (it == gradients_.end() || numel == 0 || mean_square <= 0) return cap;
  const ModuleGradients& g = it->second;
  if (g.weight_sq > 0 && g.output_sq > 0 && g.fan > 0 && std::isfinite(g.weight_sq) &&
      std::isfinite(g.output_sq)) {
    const double dx2 = e * g.weight_sq / (2.0 * static_cast<double>(numel) * g.fan * g.output_sq);
    cap = {dx2 / mean_square, "weight gradient"};
  }
  return cap;
}

codecs::CodecParams BoundedEb(double allowed_rms) {
  codecs::CodecParams params;
  params.codec = codecs::CodecId::kEb;
  params.eb_mode = codecs::EbMode::kAbsolute;
  params.error_bound = allowed_rms;
  return params;
}

}  // namespace actpack::runtime
