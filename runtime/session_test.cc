#include "runtime/session.h"

#include <cmath>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"
#include "runtime/session_test_util.h"

namespace actpack::runtime {
namespace {

TEST(SessionTest, DefaultLadderIsEveryCodecsAutoSpecsMildestFirst) {
  std::vector<std::string> ladder;
  for (const codecs::CodecParams& p : SessionOptions::DefaultLadder()) {
    ladder.push_back(codecs::FormatCodecSpec(p));
  }
  // eb's bound holds a block kept raw; then by bits per value.
  EXPECT_EQ(ladder, (std::vector<std::string>{"eb:rel=1e-2", "quant8", "quant4", "division",
                                              "quant2"}));
}

TEST(SessionTest, HarshestPerCodecIsEachCodecsSmallestBoundInRegistryOrder) {
  // quant's ladder ends at 2 bits (its mildest, quant8, first in its AutoSpecs).
  EXPECT_EQ(SessionOptions::HarshestPerCodec(),
            (std::vector<std::string>{"quant2", "eb:rel=1e-2", "division"}));
}

TEST(SessionTest, PacksDecodesAndCountsBytes) {
  Session session(Options("quant2"), HostFactory());
  Saved saved = MakeSaved(64, 256, 1);
  PackPlan plan = session.Plan(saved.info);
  ASSERT_EQ(plan.action, PackAction::kPack);
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(saved.info, plan, saved.view(), {});
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ((*packed)->raw_bytes(), 64u * 256 * 4);
  EXPECT_LT((*packed)->stored_bytes() * 14, (*packed)->raw_bytes());  // 14.6x with the header
  std::vector<float> out(64 * 256);
  ASSERT_TRUE(session.Unpack(**packed, {out.data(), codecs::DType::kFloat32, {64, 256}, codecs::Device::kCpu}, {}).ok());
  double err = 0;
  for (size_t i = 0; i < out.size(); ++i) err = std::max<double>(err, std::abs(out[i] - saved.values[i]));
  EXPECT_LT(err, 3.0);  // 2 bits over a Gaussian group
  EXPECT_GT(err, 0.0);
  SessionTotals totals = session.Totals();
  EXPECT_EQ(totals.packs, 1u);
  EXPECT_EQ(totals.live_stored, (*packed)->stored_bytes());
  packed->reset();
  totals = session.Totals();
  EXPECT_EQ(totals.live_stored, 0u);
  EXPECT_EQ(totals.peak_live_raw, 64u * 256 * 4);
  EXPECT_TRUE(session.Steps().empty());
  ASSERT_TRUE(session.EndStep().ok());
  ASSERT_EQ(session.Steps().size(), 1u);
  ASSERT_TRUE(session.EndStep().ok());  // nothing saved since: no empty step
  EXPECT_EQ(session.Steps().size(), 1u);
}

TEST(SessionTest, KeepsParametersOtherTypesAndSmallTensors) {
  Session session(Options("quant2", 4096), HostFactory());
  Saved param = MakeSaved(64, 64, 1);
  param.info.is_parameter = true;
  EXPECT_EQ(session.Plan(param.info).reason, KeepReason::kParameter);
  Saved doubles = MakeSaved(64, 64, 2);
  doubles.info.dtype = codecs::DType::kFloat64;
  EXPECT_EQ(session.Plan(doubles.info).reason, KeepReason::kNotFloatingPoint);
  Saved bools = MakeSaved(64, 64, 7);  // mask packs bools under auto only
  bools.info.dtype = codecs::DType::kBool;
  EXPECT_EQ(session.Plan(bools.info).reason, KeepReason::kNotFloatingPoint);
  Saved small = MakeSaved(2, 2, 3);
  EXPECT_EQ(session.Plan(small.info).reason, KeepReason::kBelowMinBytes);
  Saved log_probs = MakeSaved(64, 64, 5);
  log_probs.info.producer = "LogSoftmaxBackward0";
  EXPECT_EQ(session.Plan(log_probs.info).reason, KeepReason::kLossInput);
  Saved big = MakeSaved(64, 64, 4);
  EXPECT_EQ(session.Plan(big.info).action, PackAction::kPack);
  // A leaf of 1/8 of the largest tensor saved before it this step: an op's statistics (layer
  // norm's rstd, attention's logsumexp), kept exact; one just larger is packed.
  Saved activation = MakeSaved(256, 256, 11);
  EXPECT_EQ(session.Plan(activation.info).action, PackAction::kPack);
  Saved rstd = MakeSaved(256, 32, 8);
  rstd.info.producer = "leaf";
  EXPECT_EQ(session.Plan(rstd.info).reason, KeepReason::kStatistics);
  Saved larger_leaf = MakeSaved(256, 33, 9);
  larger_leaf.info.producer = "leaf";
  EXPECT_EQ(session.Plan(larger_leaf.info).action, PackAction::kPack);
  Saved slice = MakeSaved(256, 32, 12);  // a slice of the user's data: packed
  slice.info.producer = "leaf";
  slice.info.is_view = true;
  EXPECT_EQ(session.Plan(slice.info).action, PackAction::kPack);
  Saved not_a_leaf = MakeSaved(256, 32, 10);  // an op's output with a gradient: packed
  EXPECT_EQ(session.Plan(not_a_leaf.info).action, PackAction::kPack);
  Saved for_double_backward = MakeSaved(64, 64, 6);
  for_double_backward.info.in_backward = true;
  EXPECT_EQ(session.Plan(for_double_backward.info).reason, KeepReason::kSavedInBackward);
  const std::vector<SavedRecord> records = session.Records();
  EXPECT_EQ(records.back().codec, "none");
  EXPECT_EQ(records.back().reason, KeepReason::kSavedInBackward);
  EXPECT_EQ(KeepReasonCode(records.back().reason), "saved_in_backward");
  EXPECT_EQ(records.back().note, KeepReasonName(KeepReason::kSavedInBackward));
}

// max_pool2d's int64 indices, values in [0, 1024): what bitpack stores in 10 bits each.
struct SavedIndices {
  std::vector<int64_t> values;
  SavedTensorInfo info;
  codecs::TensorView view() const {
    return {values.data(), codecs::DType::kInt64, info.shape, codecs::Device::kCpu};
  }
};

SavedIndices MakeIndices(uintptr_t storage) {
  SavedIndices s;
  s.info.shape = {64, 16, 16};
  s.info.strides = {256, 16, 1};
  s.info.dtype = codecs::DType::kInt64;
  s.info.storage = storage;
  s.info.producer = "MaxPool2DWithIndicesBackward0";
  s.values.resize(64 * 16 * 16);
  for (size_t i = 0; i < s.values.size(); ++i) s.values[i] = (i * 37 + i / 5) % 1024;
  return s;
}

// Integer tensors are packed losslessly with bitpack whenever packing is on, under a fixed
// codec and under auto alike, and unpack to the same values.
TEST(SessionTest, IntegerTensorsArePackedWithBitpackAndUnpackExactly) {
  for (const char* codec : {"quant2", "identity", "auto"}) {
    SCOPED_TRACE(codec);
    SessionOptions options = Options(codec);
    if (std::string(codec) == "auto") options.budget_bytes = 1 << 30;
    Session session(options, HostFactory());
    const SavedIndices indices = MakeIndices(11);
    const PackPlan plan = session.Plan(indices.info);
    ASSERT_EQ(plan.action, PackAction::kPack);
    EXPECT_EQ(plan.params.codec, codecs::CodecId::kBitpack);
    EXPECT_TRUE(plan.measure.empty());  // lossless: nothing to measure
    absl::StatusOr<std::shared_ptr<PackedTensor>> packed =
        session.Pack(indices.info, plan, indices.view(), {});
    ASSERT_TRUE(packed.ok()) << packed.status();
    const uint64_t raw = 64 * 16 * 16 * 8;
    EXPECT_EQ((*packed)->raw_bytes(), raw);
    EXPECT_EQ((*packed)->stored_bytes(), codecs::kHeaderSize + raw * 10 / 64);
    std::vector<int64_t> out(indices.values.size(), -1);
    ASSERT_TRUE(session
                    .Unpack(**packed, {out.data(), codecs::DType::kInt64, {64, 16, 16},
                                       codecs::Device::kCpu},
                            {})
                    .ok());
    EXPECT_EQ(out, indices.values);
    const std::vector<SavedRecord> records = session.Records();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].codec, "bitpack");
    EXPECT_EQ(records[0].stored_bytes, (*packed)->stored_bytes());
    EXPECT_TRUE(records[0].candidates.empty());
    ASSERT_TRUE(session.EndStep(4 << 20).ok());
    // The dtype chose its codec, not the policy: no bytes of the policy's tensors.
    EXPECT_EQ(session.Steps()[0].automatic_bytes, 0u);
  }
}

// A checkpointed region's input is kept exact under any codec, auto included, with the reason
// in the record: its recomputation would run a codec's error through the whole region.
TEST(SessionTest, CheckpointInputsAreKeptExact) {
  for (const char* codec : {"quant4", "auto"}) {
    SCOPED_TRACE(codec);
    SessionOptions options = Options(codec);
    if (std::string(codec) == "auto") options.budget_bytes = 1 << 30;
    Session session(options, HostFactory());
    Saved input = MakeSaved(64, 256, 31);
    input.info.region_input = RegionInput::kCheckpoint;
    const PackPlan kept = session.Plan(input.info);
    EXPECT_EQ(kept.action, PackAction::kKeep);
    EXPECT_EQ(kept.reason, KeepReason::kCheckpointInput);
    EXPECT_TRUE(kept.measure.empty());
    EXPECT_EQ(session.Records()[kept.record].reason, KeepReason::kCheckpointInput);
    Saved other = MakeSaved(64, 256, 32);  // the same tensor saved by an op: packed
    EXPECT_EQ(session.Plan(other.info).action, PackAction::kPack);
  }
}

// ReLU's saved output is packed as the one bit its backward reads (`output <= 0`), under a
// fixed lossy codec and under auto; `identity` keeps it. The next layer saving the same tensor
// needs its values: it gets its own copy, by its own codec, and the mask is not reused for it.
TEST(SessionTest, ReluOutputIsPackedAsItsSignMaskAndNotSharedWithOtherReaders) {
  for (const char* codec : {"quant2", "auto", "identity"}) {
    SCOPED_TRACE(codec);
    SessionOptions options = Options(codec);
    if (std::string(codec) == "auto") options.budget_bytes = 1 << 30;
    Session session(options, HostFactory());
    Saved relu = MakeSaved(64, 256, 21);
    relu.info.producer = "ReluBackward0";
    relu.info.sign_only = true;  // the ReLU's own save
    for (float& v : relu.values) v = std::max(v, 0.0f);
    const PackPlan plan = session.Plan(relu.info);
    ASSERT_EQ(plan.action, PackAction::kPack);
    if (std::string(codec) == "identity") {
      EXPECT_FALSE(plan.sign_mask);
      EXPECT_EQ(plan.params.codec, codecs::CodecId::kIdentity);
      continue;
    }
    EXPECT_TRUE(plan.sign_mask);
    EXPECT_EQ(plan.params.codec, codecs::CodecId::kMask);
    EXPECT_TRUE(plan.measure.empty());  // lossless for its reader: nothing to measure
    // What the plugin encodes: saved <= 0.
    std::vector<uint8_t> zeroed(relu.values.size());
    for (size_t i = 0; i < zeroed.size(); ++i) zeroed[i] = relu.values[i] <= 0.0f;
    const codecs::TensorView bools{zeroed.data(), codecs::DType::kBool, relu.info.shape,
                                   codecs::Device::kCpu};
    absl::StatusOr<std::shared_ptr<PackedTensor>> packed =
        session.Pack(relu.info, plan, bools, {});
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_TRUE((*packed)->sign_mask());
    EXPECT_EQ((*packed)->raw_bytes(), 64u * 256 * 4);  // the float tensor it stands for
    EXPECT_EQ((*packed)->stored_bytes(), codecs::kHeaderSize + 64u * 256 / 8);
    std::vector<uint8_t> out(zeroed.size(), 2);
    ASSERT_TRUE(session
                    .Unpack(**packed, {out.data(), codecs::DType::kBool, relu.info.shape,
                                       codecs::Device::kCpu},
                            {})
                    .ok());
    EXPECT_EQ(out, zeroed);
    // The convolution after it saves the same tensor (same producer, not the ReLU's save):
    // packed anew, with the values.
    relu.info.sign_only = false;
    const PackPlan next = session.Plan(relu.info);
    EXPECT_NE(next.action, PackAction::kReuse);
    EXPECT_FALSE(next.sign_mask);
    EXPECT_NE(next.params.codec, codecs::CodecId::kMask);
    const std::vector<SavedRecord> records = session.Records();
    EXPECT_EQ(records[0].codec, "mask");
    EXPECT_EQ(records[0].note, "ReLU's output as its backward reads it: output <= 0");
    EXPECT_TRUE(records[0].candidates.empty());  // no item of the policy
  }
}

// Where any tensor stays as it is, an integer one does too.
TEST(SessionTest, IntegerTensorsAreKeptWhereEveryTensorIs) {
  Session session(Options("quant2", 1 << 20), HostFactory());
  const SavedIndices small = MakeIndices(12);  // 128 KiB, below min_bytes
  EXPECT_EQ(session.Plan(small.info).reason, KeepReason::kBelowMinBytes);
  SavedIndices parameter = MakeIndices(13);
  parameter.info.shape = {1024, 16, 16};
  parameter.info.is_parameter = true;
  EXPECT_EQ(session.Plan(parameter.info).reason, KeepReason::kParameter);
  SavedIndices in_backward = MakeIndices(14);
  in_backward.info.shape = {1024, 16, 16};
  in_backward.info.in_backward = true;
  EXPECT_EQ(session.Plan(in_backward.info).reason, KeepReason::kSavedInBackward);
  SessionOptions disabled = Options("quant2");
  disabled.enabled = false;
  Session off(disabled, HostFactory());
  EXPECT_EQ(off.Plan(MakeIndices(15).info).reason, KeepReason::kDisabled);
}

TEST(SessionTest, DisabledSessionKeepsEverythingAndRecordsStayBounded) {
  SessionOptions options = Options("quant2");
  options.enabled = false;
  Session session(options, HostFactory());
  for (int step = 0; step < 10; ++step) {
    Saved saved = MakeSaved(64, 256, 1);
    EXPECT_EQ(session.Plan(saved.info).reason, KeepReason::kDisabled);
    ASSERT_TRUE(session.EndStep().ok());
  }
  EXPECT_EQ(session.Records().size(), 1u);
  EXPECT_EQ(session.Steps().size(), 10u);
}

// A long run keeps the records of its first kStepsKept steps and its last kStepsKept, numbered,
// and counts every step: the history of a run of any length stays bounded.
TEST(SessionTest, KeepsTheFirstAndLastStepsOfALongRun) {
  SessionOptions options = Options("identity");
  options.enabled = false;
  Session session(options, HostFactory());
  const uint64_t total = 3 * kStepsKept + 5;
  for (uint64_t step = 0; step < total; ++step) {
    Saved saved = MakeSaved(4, 256, 1);
    session.Plan(saved.info);
    ASSERT_TRUE(session.EndStep().ok());
  }
  EXPECT_EQ(session.Totals().steps, total);
  const std::vector<StepRecord> steps = session.Steps();
  ASSERT_EQ(steps.size(), 2 * kStepsKept);
  for (uint64_t i = 0; i < kStepsKept; ++i) {
    ASSERT_EQ(steps[i].index, i);
    ASSERT_EQ(steps[kStepsKept + i].index, total - kStepsKept + i);
  }
  EXPECT_EQ(session.State().steps.size(), 2 * kStepsKept);
}

TEST(SessionTest, SameStorageAsAnotherDtypeIsNotADuplicate) {
  Session session(Options("identity"), HostFactory());
  Saved saved = MakeSaved(64, 256, 9);
  std::shared_ptr<PackedTensor> packed = *session.Pack(saved.info, session.Plan(saved.info), saved.view(), {});
  SavedTensorInfo as_int = saved.info;  // x.view(torch.int32): same storage, shape, strides
  as_int.dtype = codecs::DType::kInt32;
  as_int.supported_dtype = true;
  EXPECT_NE(session.Plan(as_int).action, PackAction::kReuse);
}

TEST(SessionTest, DedupsTheSameTensorSavedTwice) {
  Session session(Options("quant2"), HostFactory());
  Saved saved = MakeSaved(64, 256, 7);
  PackPlan first = session.Plan(saved.info);
  std::shared_ptr<PackedTensor> packed = *session.Pack(saved.info, first, saved.view(), {});
  PackPlan second = session.Plan(saved.info);
  ASSERT_EQ(second.action, PackAction::kReuse);
  EXPECT_EQ(second.duplicate, packed);
  // A new version of the same storage (an in-place op ran) is a different tensor.
  saved.info.version = 1;
  EXPECT_EQ(session.Plan(saved.info).action, PackAction::kPack);
  EXPECT_EQ(session.Totals().packs, 1u);
  EXPECT_EQ(session.Totals().reused_bytes, 64u * 256 * 4);
}

// The report's codes: one per reason, distinct, in snake case (report/schema.json lists them).
TEST(SessionTest, EveryKeepReasonHasItsOwnCode) {
  EXPECT_EQ(KeepReasonCode(KeepReason::kNone), "");
  std::set<std::string> codes;
  const int last = static_cast<int>(KeepReason::kNonFinite);
  for (int r = static_cast<int>(KeepReason::kDisabled); r <= last; ++r) {
    const std::string code(KeepReasonCode(static_cast<KeepReason>(r)));
    EXPECT_FALSE(code.empty()) << r;
    EXPECT_EQ(code.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << code;
    EXPECT_TRUE(codes.insert(code).second) << code;
    EXPECT_FALSE(KeepReasonName(static_cast<KeepReason>(r)).empty()) << code;
  }
  EXPECT_EQ(codes.size(), 13u);
}

TEST(SessionTest, NonFiniteTensorsArePackedExactly) {
  Session session(Options("quant2"), HostFactory());
  Saved saved = MakeSaved(64, 256, 1);
  saved.values[5] = std::nanf("");
  saved.values[6] = -INFINITY;
  PackPlan plan = session.Plan(saved.info);
  std::shared_ptr<PackedTensor> packed = *session.Pack(saved.info, plan, saved.view(), {});
  std::vector<float> out(64 * 256);
  ASSERT_TRUE(session.Unpack(*packed, {out.data(), codecs::DType::kFloat32, {64, 256}, codecs::Device::kCpu}, {}).ok());
  EXPECT_TRUE(std::isnan(out[5]));
  EXPECT_EQ(out[6], -INFINITY);
  EXPECT_EQ(out[100], saved.values[100]);
  EXPECT_EQ(session.Totals().exact_fallbacks, 1u);
  EXPECT_EQ(session.Records()[0].codec, "identity");
  EXPECT_EQ(session.Records()[0].reason, KeepReason::kNonFinite);
  EXPECT_EQ(KeepReasonCode(session.Records()[0].reason), "nonfinite");
  EXPECT_FALSE(session.Records()[0].note.empty());
  packed.reset();
  ASSERT_TRUE(session.EndStep().ok());
  // The next step's values are finite: its codec packs them, and the record says nothing of
  // the step before.
  Saved finite = MakeSaved(64, 256, 1, 7);
  plan = session.Plan(finite.info);
  packed = *session.Pack(finite.info, plan, finite.view(), {});
  ASSERT_EQ(session.Records().size(), 1u);
  EXPECT_EQ(session.Records()[0].codec, "quant2");
  EXPECT_EQ(session.Records()[0].reason, KeepReason::kNone);
  EXPECT_EQ(session.Records()[0].note, "");
}

TEST(SessionTest, RecordsFoldAcrossStepsAndReportIsComplete) {
  Session session(Options("quant2"), HostFactory());
  for (int step = 0; step < 3; ++step) {
    std::vector<std::shared_ptr<PackedTensor>> live;
    for (int i = 0; i < 4; ++i) {
      Saved saved = MakeSaved(32, 256, 100 + i, step * 10 + i);
      PackPlan plan = session.Plan(saved.info);
      live.push_back(*session.Pack(saved.info, plan, saved.view(), {}));
    }
    live.clear();  // backward consumed everything
    ASSERT_TRUE(session.EndStep().ok());
  }
  EXPECT_EQ(session.Steps().size(), 3u);
  ASSERT_EQ(session.Records().size(), 4u);
  EXPECT_EQ(session.Records()[2].occurrences, 3u);
  const SessionState state = session.State();
  EXPECT_EQ(state.totals.packs, 12u);
  EXPECT_GT(static_cast<double>(state.totals.packed_raw_bytes),
            14.0 * static_cast<double>(state.totals.packed_stored_bytes));
  EXPECT_EQ(state.steps.size(), 3u);
  EXPECT_EQ(state.records.size(), 4u);
  EXPECT_EQ(state.steps[0].peak_live_raw, 4u * 32 * 256 * 4);
}

TEST(SessionTest, StorageNameReusedAfterFreeIsNotADuplicate) {
  // The plugin names storages by object and guards the name; two different guards with the
  // same name cannot happen while a packed copy lives. Here the first copy is gone, so the
  // same name and shape is a new tensor and must be packed anew.
  Session session(Options("quant2"), HostFactory());
  Saved first = MakeSaved(64, 256, 42, 1);
  std::shared_ptr<PackedTensor> packed = *session.Pack(first.info, session.Plan(first.info), first.view(), {});
  packed.reset();
  Saved second = MakeSaved(64, 256, 42, 2);
  EXPECT_EQ(session.Plan(second.info).action, PackAction::kPack);
}

// Autograd may hold a packed tensor past the session that packed it (a graph kept after the
// budget context exits). The tensor stays readable, and releasing it must not reach the gone
// session: a new session is built at the same address, where a release that did would change
// its counts. Under ASan (--config=asan) any read of the freed session is reported as well.
TEST(SessionTest, PackedTensorMayOutliveTheSession) {
  const std::vector<int64_t> shape = {64, 256};
  Saved saved = MakeSaved(64, 256, 1);
  std::optional<Session> session;
  session.emplace(Options("quant2"), HostFactory());
  std::shared_ptr<PackedTensor> orphan =
      *session->Pack(saved.info, session->Plan(saved.info), saved.view(), {});
  std::vector<float> unpacked(64 * 256);
  ASSERT_TRUE(session->Unpack(*orphan, {unpacked.data(), codecs::DType::kFloat32, shape,
                                        codecs::Device::kCpu}, {}).ok());
  session.reset();

  std::vector<float> decoded(64 * 256);
  ASSERT_TRUE(codecs::Decode(orphan->data(), orphan->encoded_size(),
                             {decoded.data(), codecs::DType::kFloat32, shape,
                              codecs::Device::kCpu}, {}).ok());
  EXPECT_EQ(decoded, unpacked);

  session.emplace(Options("quant2"), HostFactory());  // the same storage: the same address
  Saved other = MakeSaved(32, 256, 2);
  std::shared_ptr<PackedTensor> live =
      *session->Pack(other.info, session->Plan(other.info), other.view(), {});
  orphan.reset();
  EXPECT_EQ(session->Totals().live_stored, live->stored_bytes());
  EXPECT_EQ(session->Totals().live_raw, live->raw_bytes());
  live.reset();
  EXPECT_EQ(session->Totals().live_stored, 0u);
  EXPECT_EQ(session->Totals().live_raw, 0u);
}

// The first step is a warm-up (its peak misses the optimizer state): the first plan comes at
// the end of the second, and both run the safe default.
uint64_t WarmUp(Session& session, uint64_t other) {
  const uint64_t first = RunStep(session);
  EXPECT_TRUE(session.EndStep(other + first).ok());
  EXPECT_EQ(session.Policy().plans, 0u);
  EXPECT_EQ(RunStep(session), first);
  return first;
}

TEST(SessionPolicyTest, ProfilesHarshThenKeepsExactWhenTheBudgetAllows) {
  Session session(AutoOptions(10 << 20), HostFactory());
  const uint64_t first = WarmUp(session, 1 << 20);
  EXPECT_LT(first * 10, 4u * 64 * 256 * 4);  // the safe default is the harshest codec
  ASSERT_TRUE(session.EndStep(first + (1 << 20)).ok());
  std::vector<PackAction> actions;
  RunStep(session, &actions);
  EXPECT_EQ(actions, std::vector<PackAction>(4, PackAction::kKeep));
  EXPECT_TRUE(session.Policy().feasible);
}

// A saved tensor at another shape in the same place of the step (a new sequence length, an
// epoch's last batch) starts from what the shape before measured, bytes scaled to its size: it
// is not profiled again before the next profile step.
TEST(SessionPolicyTest, ANewShapeInTheSamePlaceStartsFromTheShapeBeforesMeasurements) {
  SessionOptions options = AutoOptions(1 << 20);
  options.profile_every = 50;
  Session session(options, HostFactory());
  for (int step = 0; step < 4; ++step) {
    const uint64_t held = RunStep(session);
    ASSERT_TRUE(session.EndStep(held + (1 << 16)).ok());
  }
  const SavedRecord before = session.Records().front();
  Saved shorter = MakeSaved(32, 256, 300);
  shorter.info.module = "encoder.layer0";
  PackPlan plan = session.Plan(shorter.info);  // step 4: no profile step
  EXPECT_TRUE(plan.measure.empty()) << "profiled again for a new shape";
  const std::vector<SavedRecord> records = session.Records();
  const SavedRecord& added = records.back();
  ASSERT_EQ(added.shape, (std::vector<int64_t>{32, 256}));
  ASSERT_EQ(added.candidates.size(), before.candidates.size());
  for (size_t i = 0; i < added.candidates.size(); ++i) {
    EXPECT_EQ(added.candidates[i].error, before.candidates[i].error) << i;
    EXPECT_NEAR(static_cast<double>(added.candidates[i].bytes),
                before.candidates[i].bytes / 2.0, 1.0) << i;
  }
  EXPECT_EQ(added.choice, before.choice);
}

TEST(SessionPolicyTest, FitsATightBudgetWithAMixOfCodecs) {
  const uint64_t other = 1 << 20;
  const uint64_t raw = 4u * 64 * 256 * 4;  // 256 KiB
  Session session(AutoOptions(other + raw / 4), HostFactory());
  const uint64_t first = WarmUp(session, other);
  ASSERT_TRUE(session.EndStep(other + first).ok());
  const uint64_t second = RunStep(session);
  EXPECT_LE(other + second, other + raw / 4);
  EXPECT_GT(second, first);  // looser than the safe default: it uses the room it has
  const SessionState state = session.State();
  EXPECT_EQ(state.options.codec.Name(), "auto");
  EXPECT_EQ(state.records[0].module, "encoder.layer0");
  EXPECT_FALSE(state.records[0].candidates.empty());
}

TEST(SessionPolicyTest, GradientSensitivityDecidesWhoLosesPrecision) {
  // Room for three of four same-sized tensors at 8 bits and one at 4: the one to lose bits is
  // never the module with the large gradients, whichever module that is.
  const uint64_t other = 1 << 20;
  for (const char* sensitive : {"head", "encoder.layer0"}) {
    Session session(AutoOptions(other + 62000), HostFactory());
    std::map<std::string, ModuleGradients> norms = {
        {"encoder.layer0", {1.0}}, {"encoder", {1.0}}, {"head", {1.0}}};
    norms[sensitive].params_sq = 100.0;
    session.SetModuleGradients(norms);
    const uint64_t first = WarmUp(session, other);
    ASSERT_TRUE(session.EndStep(other + first).ok());
    RunStep(session);
    const std::vector<SavedRecord> records = session.Records();
    // RunStep: tensors 0 and 1 are encoder.layer0 and encoder.layer1, 2 and 3 head.
    int harsher = 0;
    for (size_t i = 0; i < 4; ++i) {
      const bool favoured = records[i].module == sensitive ||
                            (std::string(sensitive) == "head" && i >= 2);
      if (favoured) {
        EXPECT_EQ(records[i].codec, "quant8") << sensitive << " " << i;
      } else if (records[i].codec != "quant8") {
        ++harsher;
      }
    }
    EXPECT_GE(harsher, 1) << sensitive;
    EXPECT_TRUE(session.State().gradient_sensitivity);
  }
  // encoder.layer1 has no weight of its own: its parent's, 1/2 + 1/2 * 2 / mean(2, 6).
  Session session(AutoOptions(10 << 20), HostFactory());
  session.SetModuleGradients({{"encoder", {2.0}}, {"head", {6.0}}});
  RunStep(session);
  const SessionState state = session.State();
  EXPECT_EQ(state.records[1].module, "encoder.layer1");
  ASSERT_EQ(state.sensitivity.size(), state.records.size());
  EXPECT_DOUBLE_EQ(state.sensitivity[1], 0.75);
}

TEST(SessionPolicyTest, PressureRepacksKeptTensorsAndTurnsTheRestOfTheStepHarsh) {
  Session session(AutoOptions(10 << 20), HostFactory());
  const uint64_t first = WarmUp(session, 1 << 20);
  ASSERT_TRUE(session.EndStep(first + (1 << 20)).ok());
  // The plan keeps everything exact; then the allocator runs out mid-step.
  Saved kept = MakeSaved(64, 256, 200, 0);
  PackPlan plan = session.Plan(kept.info);
  ASSERT_EQ(plan.action, PackAction::kKeep);
  session.StartRelief();
  PackPlan relief = session.ReliefPlan(plan.record);
  ASSERT_EQ(relief.action, PackAction::kPack);
  EXPECT_TRUE(relief.relief);
  absl::StatusOr<std::shared_ptr<PackedTensor>> repacked =
      session.Pack(kept.info, relief, kept.view(), {});
  ASSERT_TRUE(repacked.ok()) << repacked.status();
  EXPECT_LT((*repacked)->stored_bytes() * 10, kept.info.Bytes());  // the harshest codec
  // The rest of the step is packed harsh although the plan says exact.
  Saved next = MakeSaved(64, 256, 201, 1);
  EXPECT_EQ(session.Plan(next.info).action, PackAction::kPack);
  EXPECT_EQ(session.Policy().pressure_events, 1u);
  EXPECT_EQ(session.Policy().relieved_bytes, kept.info.Bytes());
  // A parameter or an unknown record has nothing to re-pack.
  EXPECT_EQ(session.ReliefPlan(-1).action, PackAction::kKeep);
  EXPECT_EQ(session.ReliefPlan(12345).action, PackAction::kKeep);
}

TEST(SessionPolicyTest, AnImpossibleBudgetNamesTheSmallestThatWorks) {
  Session session(AutoOptions(2 << 20), HostFactory());
  const uint64_t first = WarmUp(session, 3 << 20);
  const absl::Status status = session.EndStep((3 << 20) + first);
  ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("smallest budget that would work is 3."), std::string::npos)
      << status.message();
  EXPECT_FALSE(session.Policy().feasible);
  EXPECT_EQ(session.Policy().smallest_feasible_budget, (3u << 20) + first);
}

// A budget that holds a step's 256 KiB of saved tensors exactly on top of 1 MiB of other
// memory, warmed up and planned: the step after keeps all four tensors.
constexpr uint64_t kOther = 1 << 20;
constexpr uint64_t kRaw = 4u * 64 * 256 * 4;

void PlanAllExact(Session& session) {
  const uint64_t first = WarmUp(session, kOther);
  ASSERT_TRUE(session.EndStep(kOther + first).ok());
  std::vector<PackAction> actions;
  RunStep(session, &actions);
  ASSERT_EQ(actions, std::vector<PackAction>(4, PackAction::kKeep));
}

// Memory the system counts outside the allocator (its step peak over the allocator's) is taken
// from the budget the policy plans for: the plan that fitted the whole budget no longer does.
TEST(SessionPolicyTest, MemoryOutsideTheAllocatorTakesFromThePlannedBudget) {
  const uint64_t other = kOther, raw = kRaw;
  Session session(AutoOptions(other + raw), HostFactory());
  PlanAllExact(session);
  std::vector<PackAction> actions;
  // The system counted 200 KiB more than the allocator reserved at its peak.
  const uint64_t peak = other + raw;
  ASSERT_TRUE(session.EndStep(peak, peak, peak + (200 << 10)).ok());
  EXPECT_EQ(session.Policy().outside_pool_bytes, 200u << 10);
  // Re-planned (the peak came close to the budget less the outside memory): no longer all exact.
  actions.clear();
  const uint64_t held = RunStep(session, &actions);
  EXPECT_LE(other + held, other + raw - (200 << 10));
  EXPECT_NE(actions, std::vector<PackAction>(4, PackAction::kKeep));
  // The system's count never below the allocator's: nothing outside.
  Session plain(AutoOptions(0), HostFactory());
  RunStep(plain);
  ASSERT_TRUE(plain.EndStep(peak, peak, peak - 1).ok());
  EXPECT_EQ(plain.Policy().outside_pool_bytes, 0u);
  // What the options allow outside is not taken: 200 KiB outside, 150 KiB allowed.
  SessionOptions allowing = AutoOptions(0);
  allowing.outside_allowance_bytes = 150 << 10;
  Session allowed(allowing, HostFactory());
  RunStep(allowed);
  ASSERT_TRUE(allowed.EndStep(peak, peak, peak + (200 << 10)).ok());
  EXPECT_EQ(allowed.Policy().outside_pool_bytes, 50u << 10);
  const SessionState state = session.State();
  EXPECT_EQ(state.policy.outside_pool_bytes, 200u << 10);
  EXPECT_EQ(state.steps[2].system_peak_bytes, peak + (200 << 10));
}

// The cap counts reserved bytes, the policy models allocated ones: a step where the cap bound
// (pressure) and the pool reserved 1.1x what it allocated makes the policy plan for the budget
// divided by 1.1, so the plan that fitted the whole budget (all exact) no longer does. A step
// without pressure says nothing about fragmentation (its reserved bytes include cache the pool
// would have released), so it changes nothing.
TEST(SessionPolicyTest, FragmentationUnderPressureTakesFromThePlannedBudget) {
  const uint64_t other = kOther, raw = kRaw;
  Session session(AutoOptions(other + raw), HostFactory());
  PlanAllExact(session);
  std::vector<PackAction> actions;
  EXPECT_EQ(session.Policy().fragmentation, 1.0);
  const uint64_t peak = other + raw;
  // Cached bytes without pressure: no factor.
  ASSERT_TRUE(session.EndStep(peak, peak + peak / 2, peak + peak / 2).ok());
  EXPECT_EQ(session.Policy().fragmentation, 1.0);
  RunStep(session, &actions);
  EXPECT_EQ(actions, std::vector<PackAction>(4, PackAction::kKeep));
  session.StartRelief();
  ASSERT_TRUE(session.EndStep(peak, peak + peak / 10, peak + peak / 10).ok());
  EXPECT_NEAR(session.Policy().fragmentation, 1.1, 1e-6);
  actions.clear();
  const uint64_t held = RunStep(session, &actions);
  // Planned within budget / 1.1 (less the headroom).
  EXPECT_LE(static_cast<double>(other + held), static_cast<double>(other + raw) / 1.1);
  EXPECT_NE(actions, std::vector<PackAction>(4, PackAction::kKeep));
  // A later step under pressure that reserved no more than it allocated brings it back to 1.
  session.StartRelief();
  ASSERT_TRUE(session.EndStep(other + held, other + held, other + held).ok());
  EXPECT_EQ(session.Policy().fragmentation, 1.0);
}

// One schedule for everything measured: the first three steps, then every profile_every.
// On a GPU a profile step's measurements arrive with the step's status read, after the step's
// plan. A tensor whose measurements have not arrived is held as it is stored (packed by the
// harshest codec until planned), and the rest of the step is its peak less the tensors planned:
// counted whole, a 256 KiB tensor stored in 16 KiB made the step's other memory 1.25 MiB of a
// 1.25 MiB peak and the plan impossible under a budget that holds it.
TEST(SessionPolicyTest, TensorsWhoseMeasurementsHaveNotArrivedCountAsTheyAreStored) {
  constexpr uint64_t kOtherMemory = 1 << 20;
  Session session(AutoOptions(kOtherMemory + (200 << 10)), HostFactory());
  uint64_t peak = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<Saved> saved;
    for (int i = 0; i < 3; ++i) saved.push_back(MakeSaved(64, 256, 300 + i, i));
    saved.push_back(MakeSaved(256, 256, 310, 9));  // 256 KiB, its measurements still queued
    std::vector<std::shared_ptr<PackedTensor>> live;
    uint64_t held = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      saved[i].info.module = "layer" + std::to_string(i);
      PackPlan plan = session.Plan(saved[i].info);
      if (i < 3) {
        for (size_t c = 0; c < plan.measure.size(); ++c) {
          session.RecordMeasurement(plan.record, c, Measure(saved[i], plan.measure[c]));
        }
        if (!plan.measure.empty()) session.ChooseMeasured(plan);
      }
      if (plan.action == PackAction::kKeep) {
        held += saved[i].info.Bytes();
        continue;
      }
      live.push_back(*session.Pack(saved[i].info, plan, saved[i].view(), {}));
      held += live.back()->stored_bytes();
    }
    peak = kOtherMemory + held;
    const absl::Status status = session.EndStep(peak);
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status;
  }
  EXPECT_GE(session.Policy().plans, 1u);
  EXPECT_TRUE(session.Policy().feasible);
  EXPECT_LE(session.Policy().other_bytes, peak);
  const std::vector<SavedRecord> records = session.Records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_LT(records[3].stored_bytes, 32u << 10);  // the unmeasured one: packed, not kept whole
  EXPECT_GE(session.Policy().other_bytes, kOtherMemory + records[3].stored_bytes);
}

TEST(SessionPolicyTest, MeasuresOnTheProfileStepsOnly) {
  SessionOptions options = AutoOptions(10 << 20);
  options.profile_every = 4;
  Session session(options, HostFactory());
  std::vector<uint64_t> profiled;
  for (uint64_t step = 0; step < 10; ++step) {
    const uint64_t held = RunStep(session);
    ASSERT_TRUE(session.EndStep((1 << 20) + held).ok());
    if (session.Steps().back().profiled) profiled.push_back(step);
    EXPECT_EQ(IsProfileStep(step, options.profile_every), session.Steps().back().profiled) << step;
  }
  EXPECT_EQ(profiled, (std::vector<uint64_t>{0, 1, 2, 4, 8}));
}

TEST(SessionPolicyTest, ModuleRulesOverrideTheDefault) {
  SessionOptions options = AutoOptions(0);
  options.rules.push_back({"encoder.*", *ParseCodecChoice("quant4")});
  Session session(options, HostFactory());
  RunStep(session);
  std::vector<SavedRecord> records = session.Records();
  EXPECT_EQ(records[0].codec, "quant4");
  EXPECT_EQ(records[1].codec, "quant4");
  EXPECT_EQ(records[2].codec, "none");  // auto without a budget: nothing to fit, kept exact
  EXPECT_GT(records[0].error.count, 0u);  // profiled: the report carries the error
}

// A rule's "none" keeps the matching modules' tensors as they are (no codec, no copy), and
// says why; the others follow the default.
TEST(SessionTest, ARuleOfNoneKeepsItsModulesTensors) {
  absl::StatusOr<CodecChoice> none = ParseCodecChoice(" none ");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->keep);
  EXPECT_FALSE(none->automatic);
  EXPECT_EQ(none->Name(), "none");
  SessionOptions options = Options("quant2");
  options.rules.push_back({"encoder.*", *none});
  Session session(options, HostFactory());
  Saved kept = MakeSaved(64, 256, 1);
  kept.info.module = "encoder.layer0";
  Saved packed = MakeSaved(64, 256, 2);
  packed.info.module = "head";
  const PackPlan keep_plan = session.Plan(kept.info);
  EXPECT_EQ(keep_plan.action, PackAction::kKeep);
  EXPECT_EQ(keep_plan.reason, KeepReason::kCodecNone);
  EXPECT_EQ(session.Plan(packed.info).action, PackAction::kPack);
  const std::vector<SavedRecord> records = session.Records();
  EXPECT_EQ(records[0].codec, "none");
  EXPECT_EQ(records[0].reason, KeepReason::kCodecNone);
  EXPECT_EQ(records[1].reason, KeepReason::kNone);
  EXPECT_EQ(session.Totals().kept_bytes, 64u * 256 * 4);
}

// Error-bounded mode (AC-GC). The mean square of RunStep's data (standard normal samples).
double MeanSquare(const Saved& s) {
  double sum = 0;
  for (float v : s.values) sum += static_cast<double>(v) * v;
  return sum / static_cast<double>(s.values.size());
}

TEST(SessionErrorBoundTest, FixedEbPacksAtTheBoundTheGradientsAllow) {
  SessionOptions options = Options("eb");
  options.allowed_loss_increase = 0.02;
  Session session(options, HostFactory());
  Saved fc = MakeSaved(64, 256, 300, 7);
  fc.info.module = "fc";
  Saved act = MakeSaved(64, 256, 301, 8);
  act.info.module = "act";
  // The first step keeps them exact and measures the data.
  for (Saved* s : {&fc, &act}) {
    PackPlan plan = session.Plan(s->info);
    ASSERT_EQ(plan.action, PackAction::kKeep);
    EXPECT_EQ(plan.reason, KeepReason::kAwaitingErrorBound);
    ASSERT_EQ(plan.measure.size(), 1u);
    session.RecordMeasurement(plan.record, 0, Measure(*s, plan.measure[0]));
  }
  // fc is a layer y = x W^T: ||g_W||^2 = 4, ||g_y||^2 = 2.
  session.SetModuleGradients({{"fc", {4.0, 4.0, 2.0, 1.0}}});
  ASSERT_TRUE(session.EndStep().ok());
  const double numel = 64 * 256;
  const double fc_bound = std::sqrt(0.02 * 4.0 / (2 * numel * 1.0 * 2.0));
  const double act_bound = std::sqrt(0.02 / 2 * MeanSquare(act));
  for (auto [s, bound] : {std::pair{&fc, fc_bound}, std::pair{&act, act_bound}}) {
    PackPlan plan = session.Plan(s->info);
    ASSERT_EQ(plan.action, PackAction::kPack) << s->info.module;
    EXPECT_EQ(plan.params.codec, codecs::CodecId::kEb);
    EXPECT_EQ(plan.params.eb_mode, codecs::EbMode::kAbsolute);
    EXPECT_NEAR(plan.params.error_bound, bound, bound * 1e-3) << s->info.module;
    std::shared_ptr<PackedTensor> packed = *session.Pack(s->info, plan, s->view(), {});
    std::vector<float> out(s->values.size());
    ASSERT_TRUE(session.Unpack(*packed, {out.data(), codecs::DType::kFloat32, s->info.shape,
                                         codecs::Device::kCpu}, {}).ok());
    double squared_error = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double d = static_cast<double>(out[i]) - s->values[i];
      EXPECT_LE(std::abs(d), bound * (1 + 1e-6));
      squared_error += d * d;
    }
    EXPECT_LE(squared_error / numel, bound * bound);
  }
  const SessionState state = session.State();
  EXPECT_EQ(state.records[0].cap_source, "weight gradient");
  EXPECT_NEAR(state.records[0].AllowedRms(), fc_bound, fc_bound * 1e-3);
  EXPECT_EQ(state.records[1].cap_source, "relative");
}

// One step, ended with a peak of `other` bytes besides what its saved tensors held.
absl::Status StepWithPeak(Session& session, uint64_t other) {
  return session.EndStep(other + RunStep(session));
}

TEST(SessionErrorBoundTest, ThePolicyNeverTakesACandidateAboveTheCap) {
  // A budget that quant2 everywhere would fit; a loss bound (cap e/2 = 0.5% relative squared
  // error) that rules quant2 and quant4 out, leaving exact, quant8 and eb at the bound.
  const uint64_t other = 1 << 20;
  const uint64_t raw = 4u * 64 * 256 * 4;
  SessionOptions options = AutoOptions(other + raw / 3);
  options.allowed_loss_increase = 0.01;
  Session session(options, HostFactory());
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  RunStep(session);
  const std::vector<SavedRecord> records = session.Records();
  for (const SavedRecord& record : records) {
    ASSERT_TRUE(std::isfinite(record.error_cap));
    EXPECT_DOUBLE_EQ(record.error_cap, 0.005);
    ASSERT_GE(record.bound_candidate, 1);
    ASSERT_GE(record.choice, 1) << "the budget needs every tensor packed";
    const PolicyCandidate& chosen = record.candidates[record.choice];
    EXPECT_LE(chosen.error, record.error_cap) << chosen.spec;
    EXPECT_NE(record.codec, "quant2");
    EXPECT_NE(record.codec, "quant4");
  }
  EXPECT_GT(session.Policy().capped_candidates, 0u);
  EXPECT_TRUE(session.Policy().feasible);

  // A budget only quant2 would fit: infeasible within the cap, and the message says so.
  SessionOptions tight = AutoOptions(other + raw / 12);
  tight.allowed_loss_increase = 0.01;
  Session impossible(tight, HostFactory());
  ASSERT_TRUE(StepWithPeak(impossible, other).ok());
  const absl::Status status = StepWithPeak(impossible, other);
  ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("allowed_loss_increase=0.01"), std::string::npos)
      << status.message();
}

// The fidelity floor (max_rel_rms, 0.2 by default): once measured, a codec whose relative
// RMS error on a tensor is above it is not taken for it (quant2 on Gaussian data: ~0.6), and
// a budget only such codecs would fit is infeasible, saying so; 0 lifts the floor.
TEST(SessionPolicyTest, ARecomputeRegionsInputsCarryATenthOfTheFloor) {
  SessionOptions options = AutoOptions(10 << 20);
  options.max_rel_rms = kDefaultMaxRelRms;
  Session plain(options, HostFactory());
  RunStep(plain);
  for (const SavedRecord& record : plain.Records()) EXPECT_EQ(record.codec, "quant4");
  Session regions(options, HostFactory());
  RunStep(regions, nullptr, RegionInput::kRecompute);
  const double floor = kDefaultMaxRelRms * kRecomputeInputFloorShare;
  for (const SavedRecord& record : regions.Records()) {
    EXPECT_TRUE(record.recompute_input);
    // The harshest codec whose measured error is within a tenth of the floor (quant4's is
    // not), with no choice made yet: the first step's safe default.
    EXPECT_NE(record.codec, "quant4");
    EXPECT_NE(record.codec, "quant2");
    EXPECT_NE(record.codec, "none");
    for (const PolicyCandidate& candidate : record.candidates) {
      if (candidate.spec == record.codec) {
        EXPECT_LE(candidate.error, floor * floor);
      }
    }
  }
}

TEST(SessionPolicyTest, TheFidelityFloorRulesOutCodecsMeasuredAboveIt) {
  const uint64_t other = 1 << 20;
  const uint64_t raw = 4u * 64 * 256 * 4;
  SessionOptions options = AutoOptions(other + raw / 6);  // quant4 fits, not exact or quant8
  options.max_rel_rms = SessionOptions().max_rel_rms;
  EXPECT_EQ(options.max_rel_rms, kDefaultMaxRelRms);
  Session session(options, HostFactory());
  const uint64_t first = RunStep(session);
  // The first step's safe default is the harshest codec its own measurement allows: quant4
  // (~7.8x smaller), not quant2 (~15x).
  EXPECT_LT(first * 6, raw);
  EXPECT_GT(first * 10, raw);
  for (const SavedRecord& record : session.Records()) EXPECT_EQ(record.codec, "quant4");
  ASSERT_TRUE(session.EndStep(other + first).ok());
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  RunStep(session);
  for (const SavedRecord& record : session.Records()) {
    ASSERT_GE(record.choice, 1) << "the budget needs every tensor packed";
    const PolicyCandidate& chosen = record.candidates[record.choice];
    EXPECT_LE(chosen.error, kDefaultMaxRelRms * kDefaultMaxRelRms) << chosen.spec;
    EXPECT_NE(record.codec, "quant2");
  }
  EXPECT_GT(session.Policy().capped_candidates, 0u);
  EXPECT_TRUE(session.Policy().feasible);

  for (const double floor : {kDefaultMaxRelRms, 0.0}) {
    SCOPED_TRACE(floor);
    SessionOptions tight = AutoOptions(other + raw / 12);  // only quant2 fits
    tight.max_rel_rms = floor;
    Session capped(tight, HostFactory());
    ASSERT_TRUE(StepWithPeak(capped, other).ok());
    const absl::Status status = StepWithPeak(capped, other);
    if (floor > 0) {
      ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_NE(status.message().find("max_rel_rms=0.2"), std::string::npos) << status.message();
      // Which layers the floor holds above the harshest codecs, most first.
      EXPECT_NE(status.message().find("the error caps hold "), std::string::npos)
          << status.message();
      EXPECT_NE(status.message().find("encoder.layer0 ("), std::string::npos) << status.message();
    } else {
      ASSERT_TRUE(status.ok()) << status;
      RunStep(capped);
      for (const SavedRecord& record : capped.Records()) EXPECT_EQ(record.codec, "quant2");
    }
  }
}

// A runaway gradient under auto (the plugin's gradient guard) tightens the floor: from none to
// kDefaultMaxRelRms, then halving. The automatic tensors it now rules out move to the harshest
// codec within it from their next pack on, before any plan; a fixed codec is the user's.
TEST(SessionPolicyTest, TighteningTheFloorMovesAutomaticTensorsToFinerCodecs) {
  const uint64_t other = 1 << 20;
  const uint64_t raw = 4u * 64 * 256 * 4;
  Session session(AutoOptions(other + raw / 12), HostFactory());  // only quant2 fits
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  ASSERT_TRUE(StepWithPeak(session, other).ok());
  for (const SavedRecord& record : session.Records()) ASSERT_EQ(record.codec, "quant2");
  EXPECT_EQ(session.Policy().max_rel_rms, 0.0);
  double floor = kDefaultMaxRelRms;
  for (uint64_t tightening = 1; tightening <= 3; ++tightening, floor /= 2) {
    SCOPED_TRACE(tightening);
    EXPECT_EQ(session.TightenFloor(), floor);
    EXPECT_EQ(session.Policy().max_rel_rms, floor);
    EXPECT_EQ(session.Policy().floor_tightenings, tightening);
    // The step packs before any new plan: the records' choices moved at once.
    const absl::Status status = StepWithPeak(session, other);
    for (const SavedRecord& record : session.Records()) {
      EXPECT_NE(record.codec, "quant2");
      const PolicyCandidate& chosen = record.candidates[std::max(record.choice, 0)];
      EXPECT_EQ(chosen.spec, record.choice > 0 ? record.codec : std::string(kNotPacked));
      EXPECT_LE(chosen.error, floor * floor) << chosen.spec;
    }
    // Its end plans under the new floor, which this budget cannot hold: said, with the floor.
    ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_NE(status.message().find(absl::StrCat("max_rel_rms=", floor)), std::string::npos)
        << status.message();
  }
  // The first tightening took quant4 (the harshest within 0.2), not exact.
  Session fresh(AutoOptions(other + raw / 12), HostFactory());
  ASSERT_TRUE(StepWithPeak(fresh, other).ok());
  ASSERT_TRUE(StepWithPeak(fresh, other).ok());
  fresh.TightenFloor();
  RunStep(fresh);
  for (const SavedRecord& record : fresh.Records()) EXPECT_EQ(record.codec, "quant4");

  Session fixed(Options("quant2"), HostFactory());
  ASSERT_TRUE(StepWithPeak(fixed, other).ok());
  fixed.TightenFloor();
  ASSERT_TRUE(StepWithPeak(fixed, other).ok());
  for (const SavedRecord& record : fixed.Records()) EXPECT_EQ(record.codec, "quant2");
}

TEST(SessionErrorBoundTest, WithoutABudgetAutoPacksAsSmallAsTheCapAllows) {
  SessionOptions options = AutoOptions(0);
  options.allowed_loss_increase = 0.01;
  Session session(options, HostFactory());
  std::vector<PackAction> actions;
  RunStep(session, &actions);
  EXPECT_EQ(actions, std::vector<PackAction>(4, PackAction::kKeep));  // the bound is unknown
  ASSERT_TRUE(session.EndStep().ok());
  RunStep(session);  // measures eb at the bound
  ASSERT_TRUE(session.EndStep().ok());
  actions.clear();
  const uint64_t held = RunStep(session, &actions);
  EXPECT_EQ(actions, std::vector<PackAction>(4, PackAction::kPack));
  EXPECT_LT(held * 2, 4u * 64 * 256 * 4);
  for (const SavedRecord& record : session.Records()) {
    EXPECT_LE(record.error.RelativeError(), record.error_cap) << record.codec;
    EXPECT_NE(record.codec, "quant2");
  }
}

TEST(SessionPolicyTest, GlobMatch) {
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("layer*.conv?", "layer1.0.conv1"));
  EXPECT_FALSE(GlobMatch("layer*.conv?", "layer1.0.conv12"));
  EXPECT_TRUE(GlobMatch("*attn*", "blocks.3.attn.proj"));
  EXPECT_FALSE(GlobMatch("head", "heads"));
  EXPECT_EQ(ParseCodecChoice("quant9").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParseCodecChoice(" auto ")->automatic);
  // bitpack takes integers only: a session packs them with it already, whatever the codec.
  const absl::StatusOr<CodecChoice> bitpack = ParseCodecChoice("bitpack");
  EXPECT_EQ(bitpack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bitpack.status().message().find("integer"), absl::string_view::npos);
}

}  // namespace
}  // namespace actpack::runtime
