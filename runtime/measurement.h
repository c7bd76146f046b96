// What a codec does to a saved tensor, measured on (a sample of) its data: stored bytes and
// error. The policy chooses among candidates by these numbers, not by a model of the codec.
//
// Usage:
//   CodecMeasurement m = MeasureOnHost(sample_view, full_numel, *codecs::ParseCodecSpec("quant4"));
//   if (!m.exact) use(m.bytes, m.RelativeError());
#ifndef ACTPACK_RUNTIME_MEASUREMENT_H_
#define ACTPACK_RUNTIME_MEASUREMENT_H_

#include <cstdint>

#include "codecs/codec.h"

namespace actpack::runtime {

struct CodecMeasurement {
  uint64_t bytes = 0;          // stored bytes for the whole tensor (estimated from the sample)
  double squared_error = 0.0;  // Σ (x − x̂)² over the sample
  double squared_norm = 0.0;   // Σ x² over the sample
  double max_abs_error = 0.0;
  uint64_t count = 0;          // elements in the sample
  bool exact = false;          // the codec could not encode it and the tensor is kept exact

  double RelativeError() const { return squared_norm > 0 ? squared_error / squared_norm : 0.0; }
  double RmsError() const;
};

// Measures `params` on a host tensor: encodes `sample` (a leading slice of a tensor of
// `full_numel` elements), decodes it and compares, in host memory outside the step's allocator
// so that profiling does not raise the peak it profiles. Bytes are scaled to the whole tensor.
// A codec that cannot encode the sample (non-finite values) or a failed round trip gives
// `exact`: the session keeps such a tensor as it is.
CodecMeasurement MeasureOnHost(const codecs::TensorView& sample, uint64_t full_numel,
                               const codecs::CodecParams& params);

// Profile steps measure each candidate on a sample of the saved tensor: whole leading slices
// along dim 0 up to this many elements, at least one slice.
inline constexpr int64_t kSampleElements = int64_t{1} << 18;

// The leading slices of `contiguous` that make its sample (the whole tensor when it is small
// or has one slice): a view of the same memory.
codecs::TensorView SampleOf(const codecs::TensorView& contiguous);

// Scales the encoded size of a sample of `sample_numel` elements to `full_numel` elements,
// never above the codec's bound for the whole tensor.
uint64_t ScaleEncodedSize(uint64_t used, uint64_t sample_numel, uint64_t full_numel,
                          uint64_t full_bound);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_MEASUREMENT_H_
