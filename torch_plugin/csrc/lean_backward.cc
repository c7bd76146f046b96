#include "torch_plugin/csrc/lean_backward.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/convolution_backward_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/native_batch_norm_backward_native.h>
#include <ATen/ops/threshold_backward.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>  // Node (torch 2.11 has no node.h)
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "torch_plugin/csrc/vector_loop.h"

namespace actpack::torch_plugin {
namespace {

// A decoded tensor the node that unpacked it may overwrite. The weak reference keeps the
// StorageImpl's address from being reused while the offer stands, so matching by address is
// exact; an offer whose tensor died without being taken expires.
struct Offer {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  const torch::autograd::Node* node;
};

std::mutex offers_mutex;
std::vector<Offer>& Offers() {
  static auto* offers = new std::vector<Offer>();
  return *offers;
}
std::atomic<int64_t> offers_taken{0};
std::atomic<bool> lean_enabled{true};

// Whether `tensor` was offered by the running node, which is `node_name` (an autograd formula
// known to read the tensor once, in this op: a custom Function's backward may read its saved
// tensors again after the op), and is all of its storage; takes the offer.
bool TakeOffer(const at::Tensor& tensor, std::string_view node_name) {
  if (at::GradMode::is_enabled() || !tensor.has_storage() || tensor.storage_offset() != 0 ||
      !tensor.is_non_overlapping_and_dense() ||
      tensor.storage().nbytes() != static_cast<size_t>(tensor.numel() * tensor.element_size())) {
    return false;
  }
  // A shared_ptr up to torch 2.11 (the GPU machine), an intrusive_ptr in later releases.
  const auto node = torch::autograd::get_current_node();
  if (!node) return false;
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const std::lock_guard<std::mutex> lock(offers_mutex);
  std::vector<Offer>& offers = Offers();
  const auto it = std::find_if(offers.begin(), offers.end(), [&](const Offer& o) {
    return o.node == node.get() && o.storage._unsafe_get_target() == storage;
  });
  // The node's name only for a match: most calls (plain training, ops with no offer) end above.
  if (it == offers.end() || node->name() != node_name) return false;
  offers.erase(it);
  ++offers_taken;
  return true;
}

// ---- elementwise activations: ReLU, GELU, SiLU ----

// An activation's backward, grad_input = f(grad, self), through ATen's out= kernel (which
// these registrations leave alone): over `self` when the node offered it (elementwise, so
// exact aliasing is safe), else into a new tensor, which gets the functional form's strides.
template <typename OutKernel>
at::Tensor ActivationBackward(const at::Tensor& grad, const at::Tensor& self,
                              std::string_view node_name, const OutKernel& out_kernel) {
  if (grad.sizes() == self.sizes() && grad.strides() == self.strides() &&
      grad.scalar_type() == self.scalar_type() && TakeOffer(self, node_name)) {
    at::Tensor out = self.variable_data();
    out_kernel(out);
    return out;
  }
  at::Tensor out = at::empty({0}, grad.options());
  out_kernel(out);
  return out;
}

at::Tensor ThresholdBackward(const at::Tensor& grad, const at::Tensor& self,
                             const at::Scalar& threshold) {
  return ActivationBackward(grad, self, "ReluBackward0", [&](at::Tensor& out) {
    at::threshold_backward_out(out, grad, self, threshold);
  });
}

at::Tensor GeluBackward(const at::Tensor& grad, const at::Tensor& self,
                        c10::string_view approximate) {
  return ActivationBackward(grad, self, "GeluBackward0", [&](at::Tensor& out) {
    at::gelu_backward_out(out, grad, self, approximate);
  });
}

at::Tensor SiluBackward(const at::Tensor& grad, const at::Tensor& self) {
  return ActivationBackward(grad, self, "SiluBackward0",
                            [&](at::Tensor& out) { at::silu_backward_out(out, grad, self); });
}

// ---- batch norm ----

// Where channel c's elements of a dense NCHW-like tensor lie: contiguous, one run of `spatial`
// elements per sample, at stride C*spatial; channels_last, one element in every row of C.
struct ChannelLayout {
  int64_t samples;   // N
  int64_t channels;  // C
  int64_t spatial;   // the elements per sample and channel (H*W...)
  bool channels_last;
};

std::optional<ChannelLayout> LayoutOf(const at::Tensor& t) {
  if (t.dim() < 2 || t.numel() == 0) return std::nullopt;
  const int64_t n = t.size(0), c = t.size(1), spatial = t.numel() / (n * c);
  // [N, C] (one element a sample and channel) is rows of C channels as channels_last is: the
  // row loops, not one call per element.
  if (t.is_contiguous()) return ChannelLayout{n, c, spatial, spatial == 1};
  if ((t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
      (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d))) {
    return ChannelLayout{n, c, spatial, true};
  }
  return std::nullopt;
}

// Rows [0, rows) of C channels each (channels_last): per channel, the sums of dy and of
// dy * (x - mean) added to s and d, in double.
ACTPACK_VECTOR_LOOP void AddChannelSums(const float* __restrict x, const float* __restrict dy,
                                        const double* __restrict mean, int64_t rows, int64_t C,
                                        double* __restrict s, double* __restrict d) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    for (int64_t c = 0; c < C; ++c) {
      s[c] += dyr[c];
      d[c] += static_cast<double>(dyr[c]) * (xr[c] - mean[c]);
    }
  }
}

// Per channel, the sums batch norm's backward needs: of dy and of dy * (x - mean), in double.
void ChannelSums(const ChannelLayout& l, const float* x, const float* dy,
                 const std::vector<double>& mean, std::vector<double>& sum_dy,
                 std::vector<double>& sum_dy_xmu) {
  const int64_t C = l.channels;
  if (!l.channels_last) {
    at::parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double s = 0.0, d = 0.0;
        for (int64_t n = 0; n < l.samples; ++n) {
          const int64_t base = (n * C + c) * l.spatial;
          for (int64_t i = 0; i < l.spatial; ++i) {
            s += dy[base + i];
            d += static_cast<double>(dy[base + i]) * (x[base + i] - mean[c]);
          }
        }
        sum_dy[c] = s;
        sum_dy_xmu[c] = d;
      }
    });
    return;
  }
  // Rows of C channels: each thread sums its rows into its own partial sums.
  const int64_t rows = l.samples * l.spatial, threads = at::get_num_threads();
  std::vector<double> partial(static_cast<size_t>(2 * C * threads), 0.0);
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / C), [&](int64_t begin, int64_t end) {
    double* s = partial.data() + 2 * C * at::get_thread_num();
    AddChannelSums(x + begin * C, dy + begin * C, mean.data(), end - begin, C, s, s + C);
  });
  for (int64_t t = 0; t < threads; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      sum_dy[c] += partial[2 * C * t + c];
      sum_dy_xmu[c] += partial[2 * C * t + C + c];
    }
  }
}

// Batch norm's input gradient in training, written over x, for `rows` pixels of C channels
// each (channels_last), with the per-channel factors of WriteInputGradient.
ACTPACK_VECTOR_LOOP void WriteGradientRows(float* __restrict x, const float* __restrict dy,
                                           int64_t rows, int64_t C,
                                           const float* __restrict mean,
                                           const float* __restrict a, const float* __restrict k,
                                           const float* __restrict scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * C;
    const float* dyr = dy + r * C;
    for (int64_t c = 0; c < C; ++c) xr[c] = (dyr[c] - a[c] - (xr[c] - mean[c]) * k[c]) * scale[c];
  }
}

// The same for one channel's run of `n` elements, its factors scalars.
ACTPACK_VECTOR_LOOP void WriteGradientRun(float* __restrict x, const float* __restrict dy,
                                          int64_t n, float m, float ac, float kc, float sc) {
  for (int64_t i = 0; i < n; ++i) x[i] = (dy[i] - ac - (x[i] - m) * kc) * sc;
}

// dx written over x: in training (dy - a[c] - (x - mean[c]) * k[c]) * scale[c], with a dy's
// channel mean and k its projection on x - mean; in evaluation dy * scale[c], whatever x holds.
void WriteInputGradient(const ChannelLayout& l, bool train, float* x, const float* dy,
                        const std::vector<float>& mean, const std::vector<float>& a,
                        const std::vector<float>& k, const std::vector<float>& scale) {
  const int64_t C = l.channels;
  if (!train) {
    const int64_t n = l.samples * C * l.spatial;
    at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x[i] = dy[i] * scale[l.channels_last ? i % C : i / l.spatial % C];
    });
    return;
  }
  if (!l.channels_last) {
    at::parallel_for(0, l.samples * C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t c = nc % C;
        WriteGradientRun(x + nc * l.spatial, dy + nc * l.spatial, l.spatial, mean[c], a[c], k[c],
                         scale[c]);
      }
    });
    return;
  }
  at::parallel_for(0, l.samples * l.spatial, std::max<int64_t>(1, 32768 / C),
                   [&](int64_t begin, int64_t end) {
    WriteGradientRows(x + begin * C, dy + begin * C, end - begin, C, mean.data(), a.data(),
                      k.data(), scale.data());
  });
}

std::vector<double> AsDoubles(const at::Tensor& t, int64_t n, double fill) {
  std::vector<double> out(static_cast<size_t>(n), fill);
  if (t.defined()) {
    const at::Tensor c = t.contiguous();
    for (int64_t i = 0; i < n; ++i) out[i] = c.data_ptr<float>()[i];
  }
  return out;
}

bool IsFloatVector(const std::optional<at::Tensor>& t, int64_t channels) {
  return !t.has_value() || !t->defined() ||
         (t->scalar_type() == at::kFloat && t->dim() == 1 && t->size(0) == channels &&
          t->is_cpu());
}

using BatchNormGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Batch norm's backward computed into the decoded input `x`, as ATen computes it: in training
// with the batch statistics the forward saved, in evaluation with the running ones.
BatchNormGrads BatchNormBackwardInPlace(const at::Tensor& grad_out, const at::Tensor& x,
                                        const ChannelLayout& l, const at::Tensor& weight,
                                        const at::Tensor& mean_t, const at::Tensor& var_t,
                                        bool train, double eps, std::array<bool, 3> mask) {
  const int64_t C = l.channels;
  const double count = static_cast<double>(l.samples * l.spatial);
  const std::vector<double> mean = AsDoubles(mean_t, C, 0.0);
  std::vector<double> invstd = AsDoubles(var_t, C, 1.0);
  if (!train) {
    for (double& v : invstd) v = 1.0 / std::sqrt(v + eps);
  }
  const std::vector<double> w = AsDoubles(weight, C, 1.0);
  std::vector<double> sum_dy(C, 0.0), sum_dy_xmu(C, 0.0);
  ChannelSums(l, x.data_ptr<float>(), grad_out.data_ptr<float>(), mean, sum_dy, sum_dy_xmu);
  std::vector<float> mean_f(C), a(C, 0.0f), k(C, 0.0f), scale(C);
  for (int64_t c = 0; c < C; ++c) {
    mean_f[c] = static_cast<float>(mean[c]);
    scale[c] = static_cast<float>(invstd[c] * w[c]);
    if (train) {
      a[c] = static_cast<float>(sum_dy[c] / count);
      k[c] = static_cast<float>(sum_dy_xmu[c] * invstd[c] * invstd[c] / count);
    }
  }
  at::Tensor grad_weight, grad_bias;
  const at::TensorOptions options = grad_out.options().memory_format(at::MemoryFormat::Contiguous);
  if (mask[1]) {
    grad_weight = at::empty({C}, options);
    for (int64_t c = 0; c < C; ++c) {
      grad_weight.data_ptr<float>()[c] = static_cast<float>(sum_dy_xmu[c] * invstd[c]);
    }
  }
  if (mask[2]) {
    grad_bias = at::empty({C}, options);
    for (int64_t c = 0; c < C; ++c) grad_bias.data_ptr<float>()[c] = static_cast<float>(sum_dy[c]);
  }
  WriteInputGradient(l, train, x.data_ptr<float>(), grad_out.data_ptr<float>(), mean_f, a, k, scale);
  return {x.variable_data(), grad_weight, grad_bias};
}

BatchNormGrads BatchNormBackward(const at::Tensor& grad_out, const at::Tensor& input,
                                 const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& running_mean,
                                 const std::optional<at::Tensor>& running_var,
                                 const std::optional<at::Tensor>& save_mean,
                                 const std::optional<at::Tensor>& save_invstd, bool train,
                                 double eps, std::array<bool, 3> mask) {
  const std::optional<ChannelLayout> layout = LayoutOf(input);
  const std::optional<at::Tensor>& mean = train ? save_mean : running_mean;
  const std::optional<at::Tensor>& var = train ? save_invstd : running_var;
  if (mask[0] && layout && input.scalar_type() == at::kFloat &&
      grad_out.scalar_type() == at::kFloat && grad_out.sizes() == input.sizes() &&
      grad_out.strides() == input.strides() && mean.has_value() && mean->defined() &&
      var.has_value() && var->defined() && IsFloatVector(weight, layout->channels) &&
      IsFloatVector(mean, layout->channels) && IsFloatVector(var, layout->channels) &&
      TakeOffer(input, "NativeBatchNormBackward0")) {
    return BatchNormBackwardInPlace(grad_out, input, *layout, weight.value_or(at::Tensor()),
                                    *mean, *var, train, eps, mask);
  }
  return at::native::batch_norm_backward_cpu(grad_out, input, weight, running_mean, running_var,
                                             save_mean, save_invstd, train, eps, mask);
}

// ---- 1x1 convolution ----

// A 1x1 convolution's backward as matrix products over a channels_last activation, whose
// samples' pixels are the rows of an [N*H*W, C] matrix: the weight's gradient first, from the
// decoded input, then the input's gradient written over that input. oneDNN would allocate the
// input gradient while the decoded input is still held (the bottleneck blocks' peak: their
// 1x1 convolutions read the widest activations). Stride s reads every s-th pixel: the input
// gradient is zero elsewhere.
using ConvGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

bool IsLeanPointwise(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight,
                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                     bool transposed, int64_t groups) {
  const auto is_cl = [](const at::Tensor& t) {
    return t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast);
  };
  return !transposed && groups == 1 && input.scalar_type() == at::kFloat &&
         grad_out.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1 &&
         weight.is_contiguous() && is_cl(input) && is_cl(grad_out) && stride.size() == 2 &&
         std::all_of(padding.begin(), padding.end(), [](int64_t p) { return p == 0; }) &&
         std::all_of(dilation.begin(), dilation.end(), [](int64_t d) { return d == 1; }) &&
         grad_out.size(2) == (input.size(2) - 1) / stride[0] + 1 &&
         grad_out.size(3) == (input.size(3) - 1) / stride[1] + 1;
}

// [N, C, H, W] channels_last as the [N*H*W, C] matrix it is in memory (a copy for a strided view).
at::Tensor Pixels(const at::Tensor& t) { return t.permute({0, 2, 3, 1}).reshape({-1, t.size(1)}); }

ConvGrads PointwiseBackwardInPlace(const at::Tensor& grad_out, const at::Tensor& input,
                                   const at::Tensor& weight, at::IntArrayRef stride,
                                   std::array<bool, 3> mask) {
  const bool strided = stride[0] != 1 || stride[1] != 1;
  const at::Tensor read = strided ? input.slice(2, 0, c10::nullopt, stride[0])
                                        .slice(3, 0, c10::nullopt, stride[1])
                                  : input;
  const at::Tensor dy = Pixels(grad_out);                      // [pixels, C_out]
  const at::Tensor w = weight.view({weight.size(0), weight.size(1)});  // [C_out, C_in]
  at::Tensor grad_weight, grad_bias;
  if (mask[1]) grad_weight = at::mm(dy.t(), Pixels(read)).view(weight.sizes());
  if (mask[2]) grad_bias = dy.sum(0);
  at::Tensor grad_input = input.variable_data();
  if (!strided) {
    at::Tensor rows = Pixels(grad_input);  // a view: the input is dense channels_last
    at::mm_out(rows, dy, w);
  } else {
    const at::Tensor values = at::mm(dy, w);  // the read pixels' gradients, 1/s^2 of the input
    grad_input.zero_();
    grad_input.slice(2, 0, c10::nullopt, stride[0])
        .slice(3, 0, c10::nullopt, stride[1])
        .copy_(values.view({read.size(0), read.size(2), read.size(3), read.size(1)})
                   .permute({0, 3, 1, 2}));
  }
  return {grad_input, grad_weight, grad_bias};
}

ConvGrads ConvolutionBackward(const at::Tensor& grad_out, const at::Tensor& input,
                              const at::Tensor& weight, at::OptionalIntArrayRef bias_sizes,
                              at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation, bool transposed,
                              at::IntArrayRef output_padding, int64_t groups,
                              std::array<bool, 3> mask) {
  if (mask[0] &&
      IsLeanPointwise(grad_out, input, weight, stride, padding, dilation, transposed, groups) &&
      TakeOffer(input, "ConvolutionBackward0")) {
    return PointwiseBackwardInPlace(grad_out, input, weight, stride, mask);
  }
  return at::native::convolution_backward(grad_out, input, weight, bias_sizes, stride, padding,
                                          dilation, transposed, output_padding, groups, mask);
}

// Replacing a kernel ATen registered warns that it is being replaced, which is the point here.
class Silent : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

void OfferAsScratch(const at::Tensor& decoded) {
  // The kernels are the CPU's: a device tensor's offer could never be taken.
  if (!lean_enabled.load() || at::GradMode::is_enabled() || !decoded.is_cpu() ||
      !decoded.has_storage()) {
    return;
  }
  // A shared_ptr up to torch 2.11 (the GPU machine), an intrusive_ptr in later releases.
  const auto node = torch::autograd::get_current_node();
  if (!node) return;
  const std::lock_guard<std::mutex> lock(offers_mutex);
  std::vector<Offer>& offers = Offers();
  offers.erase(std::remove_if(offers.begin(), offers.end(),
                              [](const Offer& o) { return o.storage.expired(); }),
               offers.end());
  offers.push_back({decoded.storage().getWeakStorageImpl(), node.get()});
}

void RegisterLeanBackwardKernels() {
  static const bool registered = [] {
    Silent silent;
    const c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    // Never destroyed: the kernels stay for the process, and fall back to ATen's for every
    // tensor not offered.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU,
                                       __FILE__, __LINE__);
    library->impl("native_batch_norm_backward", TORCH_FN(BatchNormBackward));
    library->impl("threshold_backward", TORCH_FN(ThresholdBackward));
    library->impl("gelu_backward", TORCH_FN(GeluBackward));
    library->impl("silu_backward", TORCH_FN(SiluBackward));
    library->impl("convolution_backward", TORCH_FN(ConvolutionBackward));
    return true;
  }();
  (void)registered;
}

void SetLeanBackward(bool enabled) { lean_enabled.store(enabled); }

int64_t LeanBackwardTaken() { return offers_taken.load(); }

}  // namespace actpack::torch_plugin
