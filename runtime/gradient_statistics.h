// What the gradients say about each module's saved tensors: how much their error matters
// (sensitivity, for the policy's weights) and how much error they may carry (AC-GC's caps, for
// the error-bounded mode). The plugin measures the statistics at the end of a backward pass.
//
// Usage:
//   GradientStatistics stats;
//   stats.Set({{"fc1", {.params_sq = 4.0, .weight_sq = 3.5, .output_sq = 0.2, .fan = 1}}});
//   double weight = stats.WeightOf("fc1.inner");          // nearest measured parent: "fc1"
//   ErrorCap cap = stats.CapFor("fc1", numel, mean_square, /*allowed_loss_increase=*/0.01);
#ifndef ACTPACK_RUNTIME_GRADIENT_STATISTICS_H_
#define ACTPACK_RUNTIME_GRADIENT_STATISTICS_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "codecs/codec.h"

namespace actpack::runtime {

// Gradient statistics of one module, measured by the plugin at the end of a backward pass.
struct ModuleGradients {
  double params_sq = 0.0;  // Σ ‖g‖² over the module's own parameters (the policy's sensitivity)
  // For a layer whose weight gradient is linear in its saved input (Linear, ConvNd): ‖g_W‖² of
  // its weight, ‖g_y‖² of its output, and the fan, how many outputs each input element reaches
  // per weight (kernel area over stride product; 1 for Linear). 0 where not measured.
  double weight_sq = 0.0;
  double output_sq = 0.0;
  double fan = 0.0;
};

// The error a saved tensor may carry in the error-bounded mode.
struct ErrorCap {
  double relative = std::numeric_limits<double>::infinity();  // relative squared error
  const char* source = "";  // "weight gradient" or "relative"
};

class GradientStatistics {
 public:
  // Replaces the statistics (a new version: caps set from the old ones are stale).
  void Set(const std::map<std::string, ModuleGradients>& gradients);

  // Times Set was called.
  uint64_t version() const { return version_; }

  // Whether any module has a parameter-gradient norm: otherwise every tensor weighs alike.
  bool measured() const { return !weight_.empty(); }

  // Sensitivity: a module's weight-gradient error grows with the relative error of its saved
  // input times its gradient's magnitude (ActNN, GACT), so a tensor's error weighs
  // 1/2 + 1/2 * its module's params_sq over the mean of those measured (the other half: the
  // error passed down through the activation gradient, not measured). The module itself, else
  // its nearest parent by dotted name ("blocks.0.attn" -> "blocks.0"), else 1.
  double WeightOf(const std::string& module) const;

  // AC-GC: the loss rises by at most a fraction `allowed_loss_increase` over an exact step when
  // every weight gradient's error stays within ||dg_W||^2 <= (e/2) ||g_W||^2. A layer
  // y = x W^T (or a convolution, each input element reaching `fan` outputs per weight) has
  // ||dg_W||^2 <= fan ||g_y||^2 ||dx||^2, so its saved input (`numel` elements of mean square
  // `mean_square`) may carry a mean squared error dx^2 = e ||g_W||^2 / (2 numel fan ||g_y||^2);
  // over the data's mean square, the cap. A tensor that is no such layer's input (an
  // activation's, a norm's) passes its error on through the activation gradient, whose
  // relative error it about equals: cap e/2.
  ErrorCap CapFor(const std::string& module, uint64_t numel, double mean_square,
                  double allowed_loss_increase) const;

 private:
  std::map<std::string, ModuleGradients> gradients_;
  std::map<std::string, double> weight_;  // mean 1 over the measured modules
  uint64_t version_ = 0;
};

// eb with every value within `allowed_rms` (absolute), so the mean squared error is too.
codecs::CodecParams BoundedEb(double allowed_rms);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_GRADIENT_STATISTICS_H_
