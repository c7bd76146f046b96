// Encode/decode throughput of every codec on the CPU, beside a memcpy of the same bytes
// measured in the same run. Counters: bytes_per_second (of the raw tensor) and ratio
// (raw bytes / encoded bytes).
//   bazel run -c opt //codecs:codecs_benchmark
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/string_view.h"
#include "benchmark/benchmark.h"
#include "codecs/codec.h"
#include "codecs/registry.h"

namespace actpack::codecs {
namespace {

// Post-ReLU-like values; for `mask`, the ReLU's mask scaled like a dropout mask.
std::vector<float> Activations(size_t n, absl::string_view spec = "") {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = std::max(0.0f, dist(rng));
  if (spec == "mask") {
    for (float& x : v) x = x > 0.0f ? 2.0f : 0.0f;
  }
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = state.range(0);
  const std::vector<float> x = Activations(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), n * sizeof(float));
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * n * sizeof(float));
}

// The tensor's shape: 1-D, or n values as NCHW maps of 64 x 64 ("nchw") or as
// [batch, 128 tokens, 512 hidden] ("btd"), the layouts the division codecs pool over.
std::vector<int64_t> ShapeOf(size_t n, absl::string_view layout) {
  const int64_t values = static_cast<int64_t>(n);
  if (layout == "nchw") return {values / (64 * 64 * 64), 64, 64, 64};
  if (layout == "btd") return {values / (128 * 512), 128, 512};
  return {values};
}

void BM_Encode(benchmark::State& state, const char* spec, const char* layout = "") {
  const size_t n = state.range(0);
  const std::vector<float> x = Activations(n, spec);
  const CodecParams params = *ParseCodecSpec(spec);
  TensorView input{x.data(), DType::kFloat32, ShapeOf(n, layout), Device::kCpu};
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  size_t used = 0;
  for (auto _ : state) {
    used = *Encode(input, params, buffer.data(), buffer.size(), {});
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * n * sizeof(float));
  state.counters["ratio"] = static_cast<double>(n * sizeof(float)) / used;
}

void BM_Decode(benchmark::State& state, const char* spec, const char* layout = "") {
  const size_t n = state.range(0);
  const std::vector<float> x = Activations(n, spec);
  const CodecParams params = *ParseCodecSpec(spec);
  TensorView input{x.data(), DType::kFloat32, ShapeOf(n, layout), Device::kCpu};
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  const size_t used = *Encode(input, params, buffer.data(), buffer.size(), {});
  std::vector<float> y(n);
  MutableTensorView output{y.data(), DType::kFloat32, input.shape, Device::kCpu};
  for (auto _ : state) {
    benchmark::DoNotOptimize(Decode(buffer.data(), used, output, {}).ok());
  }
  state.SetBytesProcessed(state.iterations() * n * sizeof(float));
  state.counters["ratio"] = static_cast<double>(n * sizeof(float)) / used;
}

BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, quant2, "quant2")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, quant2, "quant2")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, quant8, "quant8")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, quant8, "quant8")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, identity, "identity")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, identity, "identity")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, cast_bf16, "cast:bf16")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, cast_bf16, "cast:bf16")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, mask, "mask")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, mask, "mask")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, pool4, "pool4")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, pool4, "pool4")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_nchw, "division", "nchw")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_nchw, "division", "nchw")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_btd, "division", "btd")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_btd, "division", "btd")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_fft_nchw, "division_fft", "nchw")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_fft_nchw, "division_fft", "nchw")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, quant2_nchw, "quant2", "nchw")->Arg(1 << 20)->Arg(16 << 20);

}  // namespace
}  // namespace actpack::codecs
