#include "runtime/measurement.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "codecs/internal/elements.h"
#include "codecs/registry.h"

namespace actpack::runtime {

double CodecMeasurement::RmsError() const {
  return count == 0 ? 0.0 : std::sqrt(squared_error / static_cast<double>(count));
}

uint64_t ScaleEncodedSize(uint64_t used, uint64_t sample_numel, uint64_t full_numel,
                          uint64_t full_bound) {
  if (sample_numel == full_numel) return used;
  if (used <= codecs::kHeaderSize || sample_numel == 0) return full_bound;
  const double scale = static_cast<double>(full_numel) / static_cast<double>(sample_numel);
  const uint64_t scaled =
      codecs::kHeaderSize +
      static_cast<uint64_t>(std::ceil(static_cast<double>(used - codecs::kHeaderSize) * scale));
  return std::min(scaled, full_bound);
}

codecs::TensorView SampleOf(const codecs::TensorView& contiguous) {
  codecs::TensorView sample = contiguous;
  const uint64_t numel = contiguous.Spec().numel();
  if (contiguous.shape.empty() || contiguous.shape[0] <= 1 ||
      numel <= static_cast<uint64_t>(kSampleElements)) {
    return sample;
  }
  const int64_t per_slice = static_cast<int64_t>(numel) / contiguous.shape[0];
  sample.shape[0] = std::max<int64_t>(1, kSampleElements / std::max<int64_t>(1, per_slice));
  return sample;
}

CodecMeasurement MeasureOnHost(const codecs::TensorView& sample, uint64_t full_numel,
                               const codecs::CodecParams& params) {
  CodecMeasurement m;
  const codecs::TensorSpec spec = sample.Spec();
  std::vector<int64_t> full_shape = spec.shape;
  if (!full_shape.empty() && spec.numel() > 0) {
    full_shape[0] = static_cast<int64_t>(full_numel / (spec.numel() / full_shape[0]));
  }
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(spec, params);
  absl::StatusOr<size_t> bound = codecs::MaxEncodedSize({spec.dtype, full_shape}, params);
  if (!capacity.ok() || !bound.ok()) {
    m.exact = true;
    return m;
  }
  // uint32 words: codecs require 4-byte aligned buffers.
  std::vector<uint32_t> buffer((*capacity + 3) / 4);
  absl::StatusOr<size_t> used =
      codecs::Encode(sample, params, reinterpret_cast<uint8_t*>(buffer.data()), *capacity, {});
  if (!used.ok()) {
    m.exact = true;  // the session keeps such a tensor exact (non-finite values)
    return m;
  }
  // A lossless codec's decode is the sample itself: nothing to decode, no error to find.
  const codecs::Codec* codec = codecs::FindCodec(params.codec);
  const bool lossless = codec != nullptr && codec->lossless();
  std::vector<uint32_t> decoded;
  if (!lossless) {
    decoded.resize((spec.numel() * codecs::ElementSize(spec.dtype) + 3) / 4);
    const absl::Status ok =
        codecs::Decode(reinterpret_cast<const uint8_t*>(buffer.data()), *used,
                       {decoded.data(), spec.dtype, spec.shape, codecs::Device::kCpu}, {});
    if (!ok.ok()) {
      m.exact = true;
      return m;
    }
  }
  const void* restored = lossless ? sample.data : decoded.data();
  const auto compare = [&](auto load) {
    for (uint64_t i = 0; i < spec.numel(); ++i) {
      const double a = load(sample.data, i);
      const double d = load(restored, i) - a;
      m.squared_error += d * d;
      m.squared_norm += a * a;
      m.max_abs_error = std::max(m.max_abs_error, std::abs(d));
    }
  };
  namespace el = codecs::elements;
  switch (spec.dtype) {
    case codecs::DType::kFloat32: compare(el::Load<el::kF32>); break;
    case codecs::DType::kFloat16: compare(el::Load<el::kF16>); break;
    case codecs::DType::kBFloat16: compare(el::Load<el::kBF16>); break;
    default: break;  // mask and bitpack of other types: lossless, no error
  }
  m.count = spec.numel();
  m.bytes = ScaleEncodedSize(*used, spec.numel(), full_numel, *bound);
  return m;
}

}  // namespace actpack::runtime
