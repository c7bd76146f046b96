// Encode/decode throughput of every codec on the CPU, beside a memcpy of the same bytes
// measured in the same run. Counters: bytes_per_second (of the raw tensor) and ratio
// (raw bytes / encoded bytes).
//   bazel run -c opt //codecs:codecs_benchmark
#include <algorithm>
#include <cmath>
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

// What a benchmark encodes: post-ReLU values as a 1-D tensor, a smooth 2-D field
// [n / 1024, 1024] (where eb's 2-D tiles and predictors pay), or post-ReLU values as NCHW maps
// [n / 64^3, 64, 64, 64] or as [n / 65536, 128 tokens, 512 hidden] (the layouts the division
// codecs low-pass over).
enum class Data { kActivations, kSmooth, kNchw, kTokens };

std::vector<float> Input(size_t n, absl::string_view spec, Data data) {
  if (data != Data::kSmooth) return Activations(n, spec);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(static_cast<float>(i % 1024) / 37.0f) * std::cos(static_cast<float>(i / 1024) / 23.0f);
  }
  return v;
}

std::vector<int64_t> ShapeOf(size_t n, Data data) {
  const int64_t values = static_cast<int64_t>(n);
  switch (data) {
    case Data::kActivations: return {values};
    case Data::kSmooth: return {values / 1024, 1024};
    case Data::kNchw: return {values / (64 * 64 * 64), 64, 64, 64};
    default: return {values / (128 * 512), 128, 512};
  }
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

void BM_Encode(benchmark::State& state, const char* spec, Data data = Data::kActivations) {
  const size_t n = state.range(0);
  const std::vector<float> x = Input(n, spec, data);
  const CodecParams params = *ParseCodecSpec(spec);
  TensorView input{x.data(), DType::kFloat32, ShapeOf(n, data), Device::kCpu};
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  size_t used = 0;
  for (auto _ : state) {
    used = *Encode(input, params, buffer.data(), buffer.size(), {});
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * n * sizeof(float));
  state.counters["ratio"] = static_cast<double>(n * sizeof(float)) / used;
}

void BM_Decode(benchmark::State& state, const char* spec, Data data = Data::kActivations) {
  const size_t n = state.range(0);
  const std::vector<float> x = Input(n, spec, data);
  const CodecParams params = *ParseCodecSpec(spec);
  TensorView input{x.data(), DType::kFloat32, ShapeOf(n, data), Device::kCpu};
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  const size_t used = *Encode(input, params, buffer.data(), buffer.size(), {});
  std::vector<float> y(n);
  MutableTensorView output{y.data(), DType::kFloat32, ShapeOf(n, data), Device::kCpu};
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
BENCHMARK_CAPTURE(BM_Encode, eb_rel1e2, "eb:rel=1e-2")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, eb_rel1e2, "eb:rel=1e-2")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, eb_rel1e3, "eb:rel=1e-3")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, eb_rel1e3, "eb:rel=1e-3")->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, eb_rel1e2_smooth, "eb:rel=1e-2", Data::kSmooth)
    ->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, eb_rel1e2_smooth, "eb:rel=1e-2", Data::kSmooth)
    ->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_nchw, "division", Data::kNchw)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_nchw, "division", Data::kNchw)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_tokens, "division", Data::kTokens)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_tokens, "division", Data::kTokens)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, division_fft_nchw, "division_fft", Data::kNchw)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Decode, division_fft_nchw, "division_fft", Data::kNchw)->Arg(1 << 20)->Arg(16 << 20);
BENCHMARK_CAPTURE(BM_Encode, quant2_nchw, "quant2", Data::kNchw)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace
}  // namespace actpack::codecs
