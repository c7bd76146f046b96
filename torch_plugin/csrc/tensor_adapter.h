// Conversions between torch tensors and the torch-free views of codecs/ and runtime/, and
// between absl::Status and PyTorch errors. The only place that maps types across that line.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_TENSOR_ADAPTER_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_TENSOR_ADAPTER_H_

#include <torch/types.h>

#include <optional>

#include "absl/status/status.h"
#include "codecs/codec.h"

namespace actpack::torch_plugin {

// The codec dtype of a torch dtype, or nullopt for types actpack does not describe (complex,
// float8, ...).
std::optional<codecs::DType> ToCodecDType(at::ScalarType type);
at::ScalarType ToTorchDType(codecs::DType dtype);

// A view of a contiguous tensor's data.
codecs::TensorView ToView(const at::Tensor& contiguous);
codecs::MutableTensorView ToMutableView(at::Tensor& contiguous);

// Options of a uint8 buffer on the device `context` runs on (encoded bytes live there).
at::TensorOptions BufferOptions(const codecs::ExecContext& context);

// at::empty(sizes, options). A host tensor is made without the dispatcher's round trip when
// nothing could see the difference (no dispatch key included on this thread beyond the default
// ones, such as a Python mode's, and no profiler or other RecordFunction callback): the hooks
// allocate for every saved tensor, and that round trip costs more than a small codec.
at::Tensor Empty(at::IntArrayRef sizes, const at::TensorOptions& options);

// `t` (a contiguous 4-D NCHW tensor) rewritten channels_last in its own memory, returned as a
// channels_last view of the same storage. Each sample's elements lie in the same bytes in both
// layouts, so a one-sample buffer per thread transposes them in place, where a second tensor
// of the whole batch would raise the step's peak by the decoded tensor's bytes. A tensor that
// does not own its whole storage gets a channels_last copy instead.
at::Tensor ToChannelsLastInPlace(const at::Tensor& t);

// The device and current stream of `tensor`, and on CUDA the scratch allocator (torch's CUDA
// allocator) its codecs take their counters from. A CUDA tensor on a device this build has no
// kernels for is a c10::Error naming the device and the build's architectures
// (kernel_image.h).
codecs::ExecContext ContextFor(const at::Tensor& tensor);

// Throws the PyTorch error matching `status` (ValueError for kInvalidArgument,
// torch.OutOfMemoryError for kResourceExhausted, NotImplementedError for kUnimplemented,
// RuntimeError otherwise) with its message; returns when OK.
void ThrowIfError(const absl::Status& status);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_TENSOR_ADAPTER_H_
