#include "torch_plugin/csrc/tensor_adapter.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_native.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#ifdef ACTPACK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "torch_plugin/csrc/kernel_image.h"
#endif

namespace actpack::torch_plugin {

std::optional<codecs::DType> ToCodecDType(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return codecs::DType::kFloat32;
    case at::kHalf: return codecs::DType::kFloat16;
    case at::kBFloat16: return codecs::DType::kBFloat16;
    case at::kDouble: return codecs::DType::kFloat64;
    case at::kByte: return codecs::DType::kUInt8;
    case at::kChar: return codecs::DType::kInt8;
    case at::kShort: return codecs::DType::kInt16;
    case at::kInt: return codecs::DType::kInt32;
    case at::kLong: return codecs::DType::kInt64;
    case at::kBool: return codecs::DType::kBool;
    default: return std::nullopt;
  }
}

at::ScalarType ToTorchDType(codecs::DType dtype) {
  switch (dtype) {
    case codecs::DType::kFloat32: return at::kFloat;
    case codecs::DType::kFloat16: return at::kHalf;
    case codecs::DType::kBFloat16: return at::kBFloat16;
    case codecs::DType::kFloat64: return at::kDouble;
    case codecs::DType::kUInt8: return at::kByte;
    case codecs::DType::kInt8: return at::kChar;
    case codecs::DType::kInt16: return at::kShort;
    case codecs::DType::kInt32: return at::kInt;
    case codecs::DType::kInt64: return at::kLong;
    case codecs::DType::kBool: return at::kBool;
  }
  TORCH_CHECK(false, "actpack: unknown dtype code ", static_cast<int>(dtype));
}

namespace {

codecs::DType CheckedDType(const at::Tensor& tensor) {
  const std::optional<codecs::DType> dtype = ToCodecDType(tensor.scalar_type());
  TORCH_CHECK_TYPE(dtype.has_value(), "actpack: unsupported dtype ", tensor.scalar_type(),
                   "; expected a float, integer or bool tensor");
  return *dtype;
}

codecs::Device DeviceOf(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.is_cpu() || tensor.is_cuda(), "actpack: tensors on ",
                    tensor.device(), " are not supported; expected a CPU or CUDA tensor");
  return tensor.is_cuda() ? codecs::Device::kCuda : codecs::Device::kCpu;
}

#ifdef ACTPACK_WITH_CUDA
// A codec's counters on the GPU come from torch's CUDA allocator: actpack's budgeted pool when
// it is plugged in (actpack.install_allocator), so they count against the budget.
class TorchCudaScratch final : public codecs::ScratchAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, void* stream) override {
    try {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(
          bytes, static_cast<cudaStream_t>(stream));
    } catch (const c10::OutOfMemoryError& e) {
      return absl::ResourceExhaustedError(e.what_without_backtrace());
    }
  }
  void Deallocate(void* ptr, size_t bytes, void* stream) override {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  }
};
#endif


// One sample, [C, HW] in `in`, written as [HW, C] to `out` in square tiles, so that the lines
// read and the lines written stay in cache while a tile is done: a copy through a permuted view
// (TensorIterator) walks one side at stride C or HW, a cache line per element.
constexpr int64_t kTransposeTile = 32;

template <typename T>
void TransposeTiles(const T* in, T* out, int64_t channels, int64_t pixels) {
  for (int64_t p0 = 0; p0 < pixels; p0 += kTransposeTile) {
    const int64_t p1 = std::min(pixels, p0 + kTransposeTile);
    for (int64_t c0 = 0; c0 < channels; c0 += kTransposeTile) {
      const int64_t c1 = std::min(channels, c0 + kTransposeTile);
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t c = c0; c < c1; ++c) out[p * channels + c] = in[c * pixels + p];
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// 4-byte elements on AVX2 (chosen at run time: the module is built for any x86-64), 8x8 blocks
// transposed in registers: 4.8-5.3 GB/s against the scalar tiles' 1.4-2.4 on the shapes of a
// ResNet's activations (2-core EPYC), memcpy 6-10. Loads, shuffles and stores move bits: NaN
// payloads and every other pattern come through as they were.
__attribute__((target("avx2"))) void Transpose8x8(const float* in, int64_t in_stride,
                                                  float* out, int64_t out_stride) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * in_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * out_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * out_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

__attribute__((target("avx2"))) void TransposeSampleAvx2(const uint32_t* in_bits,
                                                         uint32_t* out_bits, int64_t channels,
                                                         int64_t pixels) {
  const auto* in = reinterpret_cast<const float*>(in_bits);
  auto* out = reinterpret_cast<float*>(out_bits);
  for (int64_t p0 = 0; p0 < pixels; p0 += kTransposeTile) {
    const int64_t p1 = std::min(pixels, p0 + kTransposeTile);
    for (int64_t c0 = 0; c0 < channels; c0 += kTransposeTile) {
      const int64_t c1 = std::min(channels, c0 + kTransposeTile);
      int64_t c = c0;
      for (; c + 8 <= c1; c += 8) {
        int64_t p = p0;
        for (; p + 8 <= p1; p += 8) {
          Transpose8x8(in + c * pixels + p, pixels, out + p * channels + c, channels);
        }
        for (; p < p1; ++p) {
          for (int64_t k = c; k < c + 8; ++k) out[p * channels + k] = in[k * pixels + p];
        }
      }
      for (; c < c1; ++c) {
        for (int64_t p = p0; p < p1; ++p) out[p * channels + c] = in[c * pixels + p];
      }
    }
  }
}

#endif

template <typename T>
void TransposeSample(const T* in, T* out, int64_t channels, int64_t pixels) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (sizeof(T) == 4) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return TransposeSampleAvx2(in, out, channels, pixels);
  }
#endif
  TransposeTiles(in, out, channels, pixels);
}

// Samples in parallel, each copied to its thread's row of `scratch` and transposed back.
template <typename T>
void TransposeSamplesInPlace(T* data, int64_t samples, int64_t channels, int64_t pixels,
                             T* scratch) {
  const int64_t sample_size = channels * pixels;
  at::parallel_for(0, samples, 1, [&](int64_t begin, int64_t end) {
    T* buffer = scratch + at::get_thread_num() * sample_size;
    for (int64_t n = begin; n < end; ++n) {
      T* sample = data + n * sample_size;
      std::memcpy(buffer, sample, static_cast<size_t>(sample_size) * sizeof(T));
      TransposeSample(buffer, sample, channels, pixels);
    }
  });
}

}  // namespace

codecs::TensorView ToView(const at::Tensor& contiguous) {
  TORCH_INTERNAL_ASSERT(contiguous.is_contiguous());
  return {contiguous.data_ptr(), CheckedDType(contiguous), contiguous.sizes().vec(),
          DeviceOf(contiguous)};
}

codecs::MutableTensorView ToMutableView(at::Tensor& contiguous) {
  TORCH_INTERNAL_ASSERT(contiguous.is_contiguous());
  return {contiguous.data_ptr(), CheckedDType(contiguous), contiguous.sizes().vec(),
          DeviceOf(contiguous)};
}

codecs::ExecContext ContextFor(const at::Tensor& tensor) {
  codecs::ExecContext context;
  context.device = DeviceOf(tensor);
  if (tensor.is_cuda()) {
#ifdef ACTPACK_WITH_CUDA
    static TorchCudaScratch scratch;
    CheckKernelImage(tensor.get_device());  // a GPU the build has no kernels for: say so now
    context.device_index = tensor.get_device();
    context.stream = at::cuda::getCurrentCUDAStream(tensor.get_device()).stream();
    context.scratch = &scratch;
#else
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "actpack: this build has no CUDA support; reinstall actpack "
                                "against a CUDA build of torch to pack CUDA tensors");
#endif
  }
  return context;
}

at::Tensor Empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu() && options.layout() == at::kStrided &&
      c10::impl::tls_local_dispatch_key_set().included_ == c10::default_included_set &&
      !at::hasCallbacks()) {
    // What at::empty's CPU kernel runs (it fills the memory when deterministic algorithms ask).
    return at::native::empty_cpu(sizes, c10::typeMetaToScalarType(options.dtype()),
                                 options.layout(), options.device(), options.pinned_memory());
  }
  return at::empty(sizes, options);
}

at::TensorOptions BufferOptions(const codecs::ExecContext& context) {
  at::TensorOptions options = at::TensorOptions().dtype(at::kByte);
  if (context.device == codecs::Device::kCuda) {
    return options.device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(context.device_index)));
  }
  return options.device(at::kCPU);
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, message);
    case absl::StatusCode::kResourceExhausted:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    case absl::StatusCode::kUnimplemented:
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    default:
      TORCH_CHECK(false, message);
  }
}

at::Tensor ToChannelsLastInPlace(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 4 && t.is_contiguous() && t.is_cpu(),
              "actpack: ToChannelsLastInPlace takes a contiguous 4-D CPU tensor, got sizes ",
              t.sizes(), " and strides ", t.strides());
  if (t.storage_offset() != 0 ||
      t.storage().nbytes() != static_cast<size_t>(t.numel() * t.element_size())) {
    return t.contiguous(at::MemoryFormat::ChannelsLast);  // not alone on its storage
  }
  const int64_t samples = t.size(0), channels = t.size(1), pixels = t.size(2) * t.size(3);
  at::Tensor channels_last = t.as_strided(t.sizes(), c10::get_channels_last_strides_2d(t.sizes()));
  if (channels == 1 || pixels == 1 || samples == 0) return channels_last;  // the same order
  at::Tensor scratch = Empty({at::get_num_threads(), channels * pixels}, t.options());
  void* data = t.data_ptr();
  void* buffer = scratch.data_ptr();
  switch (t.element_size()) {  // a transposition moves bytes: only the width matters
    case 1: TransposeSamplesInPlace(static_cast<uint8_t*>(data), samples, channels, pixels,
                                    static_cast<uint8_t*>(buffer)); break;
    case 2: TransposeSamplesInPlace(static_cast<uint16_t*>(data), samples, channels, pixels,
                                    static_cast<uint16_t*>(buffer)); break;
    case 4: TransposeSamplesInPlace(static_cast<uint32_t*>(data), samples, channels, pixels,
                                    static_cast<uint32_t*>(buffer)); break;
    case 8: TransposeSamplesInPlace(static_cast<uint64_t*>(data), samples, channels, pixels,
                                    static_cast<uint64_t*>(buffer)); break;
    default: return t.contiguous(at::MemoryFormat::ChannelsLast);
  }
  return channels_last;
}

}  // namespace actpack::torch_plugin
