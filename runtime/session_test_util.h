// What the session's tests and the budget run's share: host buffers, saved tensors with
// Gaussian values, and a step of four 64 KiB tensors planned, measured and packed as the
// plugin does.
#ifndef ACTPACK_RUNTIME_SESSION_TEST_UTIL_H_
#define ACTPACK_RUNTIME_SESSION_TEST_UTIL_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/measurement.h"
#include "runtime/session.h"

namespace actpack::runtime {

class VectorBuffer : public Buffer {
 public:
  explicit VectorBuffer(size_t n) : bytes_(n) {}
  uint8_t* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }
  // As the plugin's buffers do: a variable-size codec (eb) encodes into its worst case.
  absl::Status ShrinkTo(size_t n) override {
    bytes_.resize(n);
    bytes_.shrink_to_fit();
    return absl::OkStatus();
  }

 private:
  std::vector<uint8_t> bytes_;
};

inline BufferFactory HostFactory() {
  return [](size_t bytes, const codecs::ExecContext&) -> absl::StatusOr<std::unique_ptr<Buffer>> {
    return std::unique_ptr<Buffer>(new VectorBuffer(bytes));
  };
}

inline SessionOptions Options(const char* codec, uint64_t min_bytes = 1024) {
  SessionOptions options;
  options.codec = *ParseCodecChoice(codec);
  options.min_bytes = min_bytes;
  return options;
}

struct Saved {
  std::vector<float> values;
  SavedTensorInfo info;
  codecs::TensorView view() const {
    return {values.data(), codecs::DType::kFloat32, info.shape, codecs::Device::kCpu};
  }
};

inline Saved MakeSaved(int64_t rows, int64_t cols, uintptr_t storage, uint32_t seed = 1) {
  Saved s;
  s.values.resize(rows * cols);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (float& v : s.values) v = dist(rng);
  s.info.shape = {rows, cols};
  s.info.strides = {cols, 1};
  s.info.storage = storage;
  s.info.producer = "MmBackward0";
  return s;
}

// What the plugin does on a profile step: encode and decode with each candidate, measure.
inline CodecMeasurement Measure(const Saved& saved, const codecs::CodecParams& params) {
  return MeasureOnHost(saved.view(), saved.values.size(), params);
}

// One step of four 64 KiB tensors (saved as `region`'s inputs); returns the bytes held for them.
inline uint64_t RunStep(Session& session, std::vector<PackAction>* actions = nullptr,
                        RegionInput region = RegionInput::kNone) {
  std::vector<Saved> saved;
  std::vector<std::shared_ptr<PackedTensor>> live;
  uint64_t held = 0;
  for (int i = 0; i < 4; ++i) {
    saved.push_back(MakeSaved(64, 256, 200 + i, i));
    saved.back().info.module = i < 2 ? "encoder.layer" + std::to_string(i) : "head";
    saved.back().info.region_input = region;
  }
  for (const Saved& s : saved) {
    PackPlan plan = session.Plan(s.info);
    for (size_t c = 0; c < plan.measure.size(); ++c) {
      session.RecordMeasurement(plan.record, c, Measure(s, plan.measure[c]));
    }
    if (!plan.measure.empty()) session.ChooseMeasured(plan);
    if (actions != nullptr) actions->push_back(plan.action);
    if (plan.action == PackAction::kKeep) {
      held += s.info.Bytes();
      continue;
    }
    live.push_back(*session.Pack(s.info, plan, s.view(), {}));
    held += live.back()->stored_bytes();
  }
  return held;
}

// The policy's mechanics, with no fidelity floor (TheFidelityFloorRulesOutCodecsMeasuredAboveIt
// has the default one).
inline SessionOptions AutoOptions(uint64_t budget) {
  SessionOptions options = Options("auto");
  options.budget_bytes = budget;
  options.headroom = 0.0;
  options.max_rel_rms = 0.0;
  return options;
}

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_SESSION_TEST_UTIL_H_
