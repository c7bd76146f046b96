#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "allocator/units.h"
#include "codecs/internal/elements.h"
#include "codecs/registry.h"

namespace actpack::runtime {

// Links packed tensors to their session. A packed tensor can outlive the session (autograd
// keeps the graph after the budget context exits); the session detaches itself on destruction.
struct PackedTensor::Ledger {
  absl::Mutex mu;
  Session* session ABSL_GUARDED_BY(mu) = nullptr;
};

namespace {

uint64_t NanosecondsSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

codecs::CodecParams IdentityParams() {
  codecs::CodecParams params;
  params.codec = codecs::CodecId::kIdentity;
  return params;
}

// The log-probabilities a cross-entropy loss saves: backward exponentiates them, so any error
// there lands in the gradient of every logit (2-bit log-probs made training diverge).
bool IsLossInput(const std::string& producer) { return producer == "LogSoftmaxBackward0"; }

// An op's statistics: the float outputs autograd saves without a gradient of their own (so a
// leaf), small beside the activations they summarise — layer norm's mean and rstd (1/width of
// its input), attention's logsumexp (1/head width of q), batch norm's saved mean and inverse
// std. Their backward multiplies by them or exponentiates them: 2 bits on a logsumexp put
// errors up to e^2.4 into every attention probability of a small GPT (rel. RMS 0.15 in log
// space). Kept exact, they cost at most 1/kStatisticsShare of the tensor beside them.
constexpr uint64_t kStatisticsShare = 8;
bool IsStatistics(const SavedTensorInfo& info, uint64_t bytes, uint64_t largest_so_far) {
  // Not a view: a slice of the user's data is a leaf too, but no op's statistics.
  return info.producer == "leaf" && !info.is_view && bytes * kStatisticsShare <= largest_so_far;
}

// The integer dtypes `bitpack` packs.
bool IsBitpackedInteger(codecs::DType dtype) {
  switch (dtype) {
    case codecs::DType::kUInt8:
    case codecs::DType::kInt8:
    case codecs::DType::kInt16:
    case codecs::DType::kInt32:
    case codecs::DType::kInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace {

// A spec codec="auto" may choose, with its bound on a float32 activation of a typical shape.
struct Rung {
  const codecs::Codec* codec;
  codecs::CodecParams params;
  size_t bound;
};

// Every built-in codec's AutoSpecs, in the registry's order.
std::vector<Rung> AutoRungs() {
  const codecs::TensorSpec typical{codecs::DType::kFloat32, {32, 64, 56, 56}};
  std::vector<Rung> rungs;
  for (const codecs::Codec* codec : codecs::AllCodecs()) {
    for (const std::string& spec : codec->AutoSpecs()) {
      // Every AutoSpecs parses and bounds a float32 tensor (registry_test checks it).
      absl::StatusOr<codecs::CodecParams> params = codecs::ParseCodecSpec(spec);
      if (!params.ok()) continue;
      absl::StatusOr<size_t> bound = codecs::MaxEncodedSize(typical, *params);
      if (bound.ok()) rungs.push_back({codec, *params, *bound});
    }
  }
  return rungs;
}

}  // namespace

std::vector<codecs::CodecParams> SessionOptions::DefaultLadder() {
  // Mildest first, by bound (ties keep the registry's order).
  std::vector<Rung> rungs = AutoRungs();
  std::stable_sort(rungs.begin(), rungs.end(),
                   [](const Rung& a, const Rung& b) { return a.bound > b.bound; });
  std::vector<codecs::CodecParams> ladder;
  for (const Rung& rung : rungs) ladder.push_back(rung.params);
  return ladder;
}

std::vector<std::string> SessionOptions::HarshestPerCodec() {
  std::vector<Rung> harshest;  // per codec, in the registry's order
  for (const Rung& rung : AutoRungs()) {
    if (!harshest.empty() && harshest.back().codec == rung.codec) {
      if (rung.bound < harshest.back().bound) harshest.back() = rung;
    } else {
      harshest.push_back(rung);
    }
  }
  std::vector<std::string> specs;
  for (const Rung& rung : harshest) specs.push_back(codecs::FormatCodecSpec(rung.params));
  return specs;
}

bool IsProfileStep(uint64_t step, int profile_every) {
  return step < kFirstProfileSteps || step % static_cast<uint64_t>(std::max(1, profile_every)) == 0;
}

uint64_t SavedTensorInfo::Bytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n * codecs::ElementSize(dtype);
}

absl::string_view KeepReasonName(KeepReason reason) {
  switch (reason) {
    case KeepReason::kNone: return "";
    case KeepReason::kDisabled: return "packing disabled";
    case KeepReason::kCodecNone: return "codec 'none': kept as it is";
    case KeepReason::kParameter: return "parameter (or a view of one)";
    case KeepReason::kNotFloatingPoint: return "not floating point";
    case KeepReason::kBelowMinBytes: return "below min_bytes";
    case KeepReason::kLossInput: return "log-probabilities of the loss";
    case KeepReason::kFitsBudget: return "exact: fits the budget";
    case KeepReason::kSavedInBackward: return "saved during backward (create_graph or recomputation)";
    case KeepReason::kAwaitingErrorBound: return "exact until its error bound is known (first step)";
    case KeepReason::kStatistics: return "an op's statistics (mean, rstd, logsumexp)";
    case KeepReason::kCheckpointInput:
      return "a checkpointed region's input (its recomputation would carry a codec's error)";
    case KeepReason::kNonFiniteOnDevice: return "its codec met values it cannot hold on the GPU";
    case KeepReason::kNonFinite: return "its codec cannot hold its values (non-finite)";
  }
  return "";
}

absl::string_view KeepReasonCode(KeepReason reason) {
  switch (reason) {
    case KeepReason::kNone: return "";
    case KeepReason::kDisabled: return "disabled";
    case KeepReason::kCodecNone: return "codec_none";
    case KeepReason::kParameter: return "parameter";
    case KeepReason::kNotFloatingPoint: return "not_floating_point";
    case KeepReason::kBelowMinBytes: return "below_min_bytes";
    case KeepReason::kLossInput: return "loss_input";
    case KeepReason::kFitsBudget: return "fits_budget";
    case KeepReason::kSavedInBackward: return "saved_in_backward";
    case KeepReason::kAwaitingErrorBound: return "awaiting_error_bound";
    case KeepReason::kStatistics: return "statistics";
    case KeepReason::kCheckpointInput: return "checkpoint_input";
    case KeepReason::kNonFiniteOnDevice: return "nonfinite_on_device";
    case KeepReason::kNonFinite: return "nonfinite";
  }
  return "";
}

PackedTensor::~PackedTensor() {
  if (status_pool_ != nullptr) status_pool_->Release(slot_);
  if (ledger_ == nullptr) return;
  absl::MutexLock lock(&ledger_->mu);
  if (ledger_->session != nullptr) ledger_->session->OnRelease(*this);
}

Session::Session(SessionOptions options, BufferFactory factory)
    : options_(std::move(options)),
      factory_(std::move(factory)),
      ledger_(std::make_shared<PackedTensor::Ledger>()) {
  policy_.max_rel_rms = options_.max_rel_rms;
  absl::MutexLock lock(&ledger_->mu);
  ledger_->session = this;
}

Session::~Session() {
  absl::MutexLock lock(&ledger_->mu);
  ledger_->session = nullptr;
}

int Session::RecordFor(const SavedTensorInfo& info, int ordinal) {
  if (static_cast<size_t>(ordinal) >= ordinal_records_.size()) {
    ordinal_records_.resize(static_cast<size_t>(ordinal) + 1);
  }
  std::vector<int>& candidates = ordinal_records_[static_cast<size_t>(ordinal)];
  for (int index : candidates) {
    const SavedRecord& known = records_[index];
    if (known.producer == info.producer && known.shape == info.shape) return index;
  }
  SavedRecord record;
  // The same position and op at another shape (a new sequence length, the last batch of an
  // epoch) starts from what that shape measured: errors are ratios to the data, and the bytes
  // scale with the elements. It is measured again at the usual profile steps, not at once.
  for (int index : candidates) {
    const SavedRecord& known = records_[index];
    if (known.producer != info.producer || known.candidates.empty()) continue;
    const uint64_t known_numel = codecs::TensorSpec{known.dtype, known.shape}.numel();
    const uint64_t numel = codecs::TensorSpec{info.dtype, info.shape}.numel();
    if (known.dtype != info.dtype || known_numel == 0) continue;
    const double scale = static_cast<double>(numel) / static_cast<double>(known_numel);
    record.candidates = known.candidates;
    for (PolicyCandidate& c : record.candidates) {
      c.bytes = static_cast<uint64_t>(std::ceil(static_cast<double>(c.bytes) * scale));
    }
    record.codecs = known.codecs;
    record.choice = known.choice;
    record.error = known.error;
    record.measured_step = known.measured_step;
    record.mean_square = known.mean_square;
    record.bound_candidate = known.bound_candidate;
    break;
  }
  record.ordinal = ordinal;
  record.producer = info.producer;
  record.module = info.module;
  record.recompute_input = info.region_input == RegionInput::kRecompute;
  record.shape = info.shape;
  record.dtype = info.dtype;
  record.assigned = ChoiceFor(options_.rules, options_.codec, info.module);
  records_.push_back(std::move(record));
  candidates.push_back(static_cast<int>(records_.size() - 1));
  return static_cast<int>(records_.size() - 1);
}

PackPlan Session::Plan(const SavedTensorInfo& info) {
  CheckedLock lock(&mu_);
  PackPlan plan;
  plan.record = RecordFor(info, ordinal_++);
  step_records_.push_back(plan.record);
  SavedRecord& record = records_[plan.record];
  const uint64_t bytes = info.Bytes();
  current_step_.saved_raw_bytes += bytes;
  record.raw_bytes = bytes;
  ++record.occurrences;

  // Codecs the dtype decides, lossless: a bool tensor (a dropout or comparison mask) is packed
  // at 1 bit per value when the policy chooses; an integer tensor (max_pool2d's indices, in
  // [0, H * W) of the input plane) at the bits its range needs, with `bitpack`, whenever
  // packing is on: under a fixed codec too, since it costs no accuracy.
  const bool mask = record.assigned.automatic && info.supported_dtype &&
                    info.dtype == codecs::DType::kBool &&
                    codecs::FindCodec(codecs::CodecId::kMask) != nullptr;
  const bool bitpack = info.supported_dtype && IsBitpackedInteger(info.dtype) &&
                       codecs::FindCodec(codecs::CodecId::kBitpack) != nullptr;
  // ReLU's own save of its output, which its backward reads only as `output <= 0`
  // (threshold_backward): a 1-bit mask of that holds all it reads, exactly. Packed by value,
  // 2 bits turned small positive outputs into zeros and dropped their gradients: a ResNet-50's
  // first blocks got gradients of cosine ~0 against exact training (quant2; 0.27 under
  // quant4). ActNN saves ReLU the same way. Whenever the tensor would be packed lossily,
  // automatic or fixed; `identity` stays exact.
  const bool sign = info.sign_only && info.supported_dtype && codecs::IsLossyFloat(info.dtype) &&
                    (record.assigned.automatic ||
                     record.assigned.params.codec != codecs::CodecId::kIdentity) &&
                    codecs::FindCodec(codecs::CodecId::kMask) != nullptr;
  record.lossless = mask || bitpack || sign;
  const uint64_t largest_so_far = largest_saved_this_step_;
  if (!info.is_parameter) largest_saved_this_step_ = std::max(largest_saved_this_step_, bytes);
  if (!options_.enabled) {
    plan.reason = KeepReason::kDisabled;
  } else if (record.assigned.keep) {
    plan.reason = KeepReason::kCodecNone;
  } else if (info.is_parameter) {
    plan.reason = KeepReason::kParameter;
  } else if (info.in_backward) {
    plan.reason = KeepReason::kSavedInBackward;
  } else if (info.region_input == RegionInput::kCheckpoint) {
    plan.reason = KeepReason::kCheckpointInput;
  } else if (!mask && !bitpack && (!info.supported_dtype || !codecs::IsLossyFloat(info.dtype))) {
    plan.reason = KeepReason::kNotFloatingPoint;
  } else if (bytes < options_.min_bytes) {
    plan.reason = KeepReason::kBelowMinBytes;
  } else if (IsLossInput(info.producer)) {
    plan.reason = KeepReason::kLossInput;
  } else if (IsStatistics(info, bytes, largest_so_far)) {
    plan.reason = KeepReason::kStatistics;
  } else if (record.device_flagged) {
    plan.reason = KeepReason::kNonFiniteOnDevice;
  }
  if (plan.reason != KeepReason::kNone) {
    plan.action = PackAction::kKeep;
    record.codec = std::string(kNotPacked);
    record.reason = plan.reason;
    // A flagged record's note says what its codec met, and when.
    if (plan.reason != KeepReason::kNonFiniteOnDevice) {
      record.note = std::string(KeepReasonName(plan.reason));
    }
    totals_.kept_bytes += bytes;
    current_step_.stored_bytes += bytes;
    return plan;
  }

  // Packed this step: what an earlier step said of it (kept while its bound was unknown, or
  // packed exactly) no longer holds.
  record.reason = KeepReason::kNone;
  record.note.clear();
  auto it = sign ? dedup_.end()
                 : dedup_.find(DedupKey{info.storage, info.storage_offset, info.version, info.dtype});
  if (it != dedup_.end()) {
    std::vector<DedupEntry>& entries = it->second;
    const auto entry = DedupEntry::Find(entries, info);
    if (entry != entries.end()) {
      if (std::shared_ptr<PackedTensor> earlier = entry->packed.lock()) {
        plan.action = PackAction::kReuse;
        plan.duplicate = std::move(earlier);
        ++record.reused;
        totals_.reused_bytes += bytes;
        return plan;
      }
      entries.erase(entry);
    }
    if (entries.empty()) dedup_.erase(it);
  }
  // Measured on profile steps and when never measured (or its error bound changed while this
  // tensor was planned), once per step. A call: planning may reset measured_step.
  const auto profile = [&] {
    const bool due = IsProfileStep(step_index_, options_.profile_every) ||
                     record.measured_step == UINT64_MAX;
    return due && record.measured_step != step_index_;
  };
  plan.action = PackAction::kPack;
  if (mask || sign) {
    plan.params.codec = codecs::CodecId::kMask;
    plan.sign_mask = sign;
  } else if (bitpack) {
    plan.params.codec = codecs::CodecId::kBitpack;
  } else if (record.assigned.automatic) {
    PlanAutomatic(info, record, plan);
    if (profile()) {
      plan.measure = record.codecs;
      // With nothing to measure, identity still gives the data's mean square (error bounds).
      if (plan.measure.empty() && options_.allowed_loss_increase > 0) {
        plan.measure = {IdentityParams()};
      }
      record.measured_step = step_index_;
      current_step_.profiled = true;
    }
  } else if (options_.allowed_loss_increase > 0 &&
             record.assigned.params.codec == codecs::CodecId::kEb) {
    PlanBoundedEb(record, plan);
    if (profile()) {
      plan.measure = {plan.action == PackAction::kKeep ? IdentityParams() : plan.params};
      record.measured_step = step_index_;
    }
  } else {
    plan.params = record.assigned.params;
    if (profile()) {
      plan.measure = {plan.params};
      record.measured_step = step_index_;
    }
  }
  if (plan.action == PackAction::kKeep) {
    record.codec = std::string(kNotPacked);
    record.reason = plan.reason;
    record.note = std::string(KeepReasonName(plan.reason));
    totals_.kept_bytes += bytes;
    current_step_.stored_bytes += bytes;
    if (record.assigned.automatic) current_step_.automatic_bytes += bytes;
    return plan;
  }
  plan.params.seed = options_.seed + pack_counter_++;
  return plan;
}

void Session::MeasureCandidates(PackPlan& plan, const codecs::TensorView& contiguous,
                                const codecs::ExecContext& context) {
  if (plan.measure.empty()) return;
  const codecs::TensorView sample = SampleOf(contiguous);
  const uint64_t full_numel = contiguous.Spec().numel();
  if (context.device != codecs::Device::kCuda) {
    for (size_t i = 0; i < plan.measure.size(); ++i) {
      RecordMeasurement(plan.record, i, MeasureOnHost(sample, full_numel, plan.measure[i]));
    }
    ChooseMeasured(plan);
    return;
  }
  // On a GPU the sample travels once, queued, and waits for the step's status read.
  std::shared_ptr<DeviceStatusPool> pool = StatusPoolFor(context);
  const size_t bytes = sample.Spec().numel() * codecs::ElementSize(sample.dtype);
  absl::StatusOr<DeviceStatusPool::Sample> staged =
      pool->StageSample(sample.data, bytes, context.stream);
  CheckedLock lock(&mu_);
  if (!staged.ok()) {
    // No room to stage it this step: measured at its next pack instead.
    if (plan.record >= 0 && static_cast<size_t>(plan.record) < records_.size()) {
      records_[plan.record].measured_step = UINT64_MAX;
    }
    return;
  }
  codecs::TensorView host = sample;
  host.data = staged->host;
  host.device = codecs::Device::kCpu;
  pending_samples_.push_back(
      PendingSample{plan.record, plan.measure, std::move(host), full_numel, pool, *staged});
}

absl::StatusOr<std::shared_ptr<PackedTensor>> Session::Pack(const SavedTensorInfo& info,
                                                            const PackPlan& plan,
                                                            const codecs::TensorView& contiguous,
                                                            const codecs::ExecContext& context) {
  if (context.device == codecs::Device::kCuda) return PackDeferred(info, plan, contiguous, context);
  codecs::CodecParams params = plan.params;
  std::string note;
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(contiguous.Spec(), params);
  if (!capacity.ok()) return capacity.status();
  CheckNoneHeld("allocating a packed tensor's buffer");
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = factory_(*capacity, context);
  if (!buffer.ok()) return buffer.status();
  const auto encode_start = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> used =
      codecs::Encode(contiguous, params, (*buffer)->data(), (*buffer)->size(), context);
  if (!used.ok() && used.status().code() == absl::StatusCode::kFailedPrecondition) {
    // The codec cannot represent this data (non-finite values): keep it exact.
    note = std::string(used.status().message());
    params = IdentityParams();
    buffer->reset();
    capacity = codecs::MaxEncodedSize(contiguous.Spec(), params);
    if (!capacity.ok()) return capacity.status();
    buffer = factory_(*capacity, context);
    if (!buffer.ok()) return buffer.status();
    used = codecs::Encode(contiguous, params, (*buffer)->data(), (*buffer)->size(), context);
  }
  if (!used.ok()) return used.status();
  const uint64_t encode_ns = NanosecondsSince(encode_start);
  if (*used < (*buffer)->size()) {
    absl::Status shrunk = (*buffer)->ShrinkTo(*used);
    if (!shrunk.ok()) return shrunk;
  }
  auto packed = NewPacked(info, std::move(*buffer), *used, context);
  CheckedLock lock(&mu_);
  totals_.codec_nanoseconds += encode_ns;
  Admit(info, plan, params, note, packed);
  return packed;
}

std::shared_ptr<DeviceStatusPool> Session::StatusPoolFor(const codecs::ExecContext& context) {
  CheckedLock lock(&mu_);
  std::shared_ptr<DeviceStatusPool>& pool = status_pools_[context.device_index];
  if (pool == nullptr) pool = std::make_shared<DeviceStatusPool>(factory_);
  return pool;
}

absl::StatusOr<std::shared_ptr<SpillRoom>> Session::SpillRoomFor(
    const codecs::ExecContext& context) {
  const std::pair<int, void*> key{context.device_index, context.stream};
  uint64_t capacity = 0;
  {
    CheckedLock lock(&mu_);
    auto it = spill_rooms_.find(key);
    if (it != spill_rooms_.end()) return it->second;
    // Room for the largest encoding sized on the device so far, and an eighth: one outgrown
    // prediction of any tensor fits whole.
    constexpr uint64_t kMinimum = uint64_t{1} << 20;
    capacity = std::max(kMinimum, (largest_sized_bytes_ + largest_sized_bytes_ / 8 + 255) /
                                      256 * 256);
  }
  CheckNoneHeld("allocating the spill room");
  constexpr uint64_t kCounterBytes = 256;
  absl::StatusOr<std::unique_ptr<Buffer>> memory = factory_(capacity + kCounterBytes, context);
  if (!memory.ok()) return memory.status();
  auto room = std::make_shared<SpillRoom>();
  room->memory = std::move(*memory);
  room->arena.data = room->memory->data();
  room->arena.capacity = capacity;
  room->arena.used = reinterpret_cast<unsigned long long*>(room->memory->data() + capacity);
  absl::Status zeroed =
      DeviceStatusPool::ZeroOnStream(room->arena.used, sizeof(unsigned long long), context.stream);
  if (!zeroed.ok()) return zeroed;
  CheckedLock lock(&mu_);
  auto [it, added] = spill_rooms_.emplace(key, room);
  return it->second;  // another thread's, when it made one meanwhile
}

absl::StatusOr<std::shared_ptr<PackedTensor>> Session::PackDeferred(
    const SavedTensorInfo& info, const PackPlan& plan, const codecs::TensorView& contiguous,
    const codecs::ExecContext& context) {
  std::shared_ptr<DeviceStatusPool> pool = StatusPoolFor(context);
  absl::StatusOr<DeviceStatusPool::Slot> slot = pool->Acquire(context);
  if (!slot.ok()) return slot.status();
  const bool timed = ProfilingNow();
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(contiguous.Spec(), plan.params);
  if (!capacity.ok()) {
    pool->Release(*slot);
    return capacity.status();
  }
  // Where the device decides the size (eb, bitpack), a record that has been resolved before
  // says how large the encoding will be: the buffer is that and an eighth, and the encoding is
  // written into room for its bound for a moment, then moved there (or into the step's spill
  // room when it outgrew it). The bound stays the buffer of a record's first encoding.
  size_t predicted = 0;
  {
    CheckedLock lock(&mu_);
    if (plan.record >= 0 && static_cast<size_t>(plan.record) < records_.size()) {
      const SavedRecord& record = records_[plan.record];
      if (record.sized_bytes > 0 && record.sized_spec == codecs::FormatCodecSpec(plan.params)) {
        predicted = (record.sized_bytes + record.sized_bytes / 8 + 255) / 256 * 256;
      }
    }
  }
  if (predicted >= *capacity) predicted = 0;
  CheckNoneHeld("allocating a packed tensor's buffer");
  std::unique_ptr<Buffer> staging;  // room for the bound, while the encode writes
  absl::StatusOr<std::shared_ptr<SpillRoom>> spill = std::shared_ptr<SpillRoom>();
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = factory_(predicted > 0 ? predicted : *capacity,
                                                            context);
  if (buffer.ok() && predicted > 0) {
    absl::StatusOr<std::unique_ptr<Buffer>> room = factory_(*capacity, context);
    if (room.ok()) staging = std::move(*room);
    spill = room.ok() ? SpillRoomFor(context) : room.status();
    if (!spill.ok()) buffer = spill.status();
  }
  uint8_t* written = staging != nullptr ? staging->data() : buffer.ok() ? (*buffer)->data() : nullptr;
  absl::Status began = timed && buffer.ok()
                           ? pool->TimeBegin(*slot, DeviceStatusPool::kEncode, context.stream)
                           : absl::OkStatus();
  absl::StatusOr<codecs::DeferredEncoding> encoding =
      !began.ok() ? began
      : buffer.ok() ? codecs::EncodeDeferred(contiguous, plan.params, written, *capacity, context,
                                             slot->device)
                    : buffer.status();
  if (encoding.ok() && timed) {
    absl::Status ended = pool->TimeEnd(*slot, DeviceStatusPool::kEncode, context.stream);
    if (!ended.ok()) encoding = ended;
  }
  if (encoding.ok() && staging != nullptr) {
    absl::Status placed = codecs::PlaceDeferred(staging->data(), staging->size(),
                                                (*buffer)->data(), (*buffer)->size(),
                                                (*spill)->arena, slot->device, context);
    if (!placed.ok()) encoding = placed;
  }
  staging.reset();  // free in stream order, after the move
  if (!encoding.ok()) {
    pool->Release(*slot);
    return encoding.status();
  }
  pool->UseStream(context.stream);
  // eb's and bitpack's sizes are decided on the device: their status is copied back as soon as
  // the encode has run, and the host completes the encoding when it sees it (never waiting).
  const bool sized_on_device = encoding->device_decided && encoding->header.payload_size == 0;
  if (sized_on_device) {
    absl::Status mirrored = pool->MirrorOne(*slot, context.stream);
    if (!mirrored.ok()) {
      pool->Release(*slot);
      return mirrored;
    }
  }
  auto packed = NewPacked(info, std::move(*buffer), encoding->bytes, context);
  packed->deferred_ = true;
  packed->encoding_ = *encoding;
  packed->status_pool_ = pool;
  packed->slot_ = *slot;
  packed->record_ = plan.record;
  packed->placed_ = predicted > 0;
  if (packed->placed_) packed->spill_ = *spill;
  Deferred work;  // done after mu_
  {
    CheckedLock lock(&mu_);
    Admit(info, plan, plan.params, "", packed);
    deferred_this_step_.push_back(DeferredUse{pool, *slot, plan.record, encoding->header, packed,
                                              /*decode=*/false, packed->spec_});
    if (sized_on_device) unresolved_[context.device_index].push_back(packed);
    ResolveReady(context.device_index, &work);
  }
  Finish(work);
  return packed;
}

bool Session::ProfilingNow() const {
  CheckedLock lock(&mu_);
  return IsProfileStep(step_index_, options_.profile_every);
}

std::shared_ptr<PackedTensor> Session::NewPacked(const SavedTensorInfo& info,
                                                 std::unique_ptr<Buffer> buffer,
                                                 size_t encoded_size,
                                                 const codecs::ExecContext& context) {
  auto packed = std::shared_ptr<PackedTensor>(new PackedTensor());
  packed->shape_ = info.shape;
  packed->dtype_ = info.dtype;
  packed->raw_bytes_ = info.Bytes();
  packed->stored_bytes_ = buffer->size();
  packed->encoded_size_ = encoded_size;
  packed->stream_ = context.stream;
  packed->device_index_ = context.device_index;
  packed->storage_guard_ = info.storage_guard;
  packed->buffer_ = std::move(buffer);
  return packed;
}

void Session::Admit(const SavedTensorInfo& info, const PackPlan& plan,
                    const codecs::CodecParams& params, const std::string& note,
                    const std::shared_ptr<PackedTensor>& packed) {
  packed->ledger_ = ledger_;
  SavedRecord& record = records_[plan.record];
  record.codec = codecs::FormatCodecSpec(params);
  record.stored_bytes = packed->stored_bytes_;
  if (!note.empty()) {  // the codec refused its values: packed by identity
    record.note = note;
    record.reason = KeepReason::kNonFinite;
    ++totals_.exact_fallbacks;
  }
  if (plan.relief) {
    // It was counted as kept when it was saved.
    totals_.kept_bytes -= std::min(totals_.kept_bytes, packed->raw_bytes_);
    current_step_.stored_bytes -= std::min(current_step_.stored_bytes, packed->raw_bytes_);
    current_step_.automatic_bytes -= std::min(current_step_.automatic_bytes, packed->raw_bytes_);
    policy_.relieved_bytes += packed->raw_bytes_;
  }
  packed->codec_ = params.codec;
  packed->spec_ = record.codec;
  packed->sign_mask_ = plan.sign_mask;
  if (plan.sign_mask) record.note = "ReLU's output as its backward reads it: output <= 0";
  ++totals_.packs;
  totals_.packed_raw_bytes += packed->raw_bytes_;
  totals_.packed_stored_bytes += packed->stored_bytes_;
  totals_.live_stored += packed->stored_bytes_;
  totals_.live_raw += packed->raw_bytes_;
  totals_.peak_live_stored = std::max(totals_.peak_live_stored, totals_.live_stored);
  totals_.peak_live_raw = std::max(totals_.peak_live_raw, totals_.live_raw);
  current_step_.stored_bytes += packed->stored_bytes_;
  // What the dtype's codec stores is no choice of the policy: the rest of the step, to it.
  if (record.assigned.automatic && !record.lossless) {
    current_step_.automatic_bytes += packed->stored_bytes_;
  }
  if (totals_.live_stored > current_step_.peak_live_stored) {
    current_step_.peak_live_stored = totals_.live_stored;
    current_step_.peak_live_raw = totals_.live_raw;
  }
  if (plan.sign_mask) return;  // other readers of the tensor need its values
  std::vector<DedupEntry>& entries =
      dedup_[DedupKey{info.storage, info.storage_offset, info.version, info.dtype}];
  const auto entry = DedupEntry::Find(entries, info);
  if (entry == entries.end()) {
    entries.push_back({info.shape, info.strides, packed});
  } else {
    entry->packed = packed;
  }
}

void Session::Resolve(const std::shared_ptr<PackedTensor>& packed,
                      const codecs::DeviceStatus& read_back, Deferred* work) {
  const bool size_decided = packed->encoding_.device_decided &&
                            packed->encoding_.header.payload_size == 0;
  packed->encoding_ = codecs::Resolve(packed->encoding_, read_back);
  packed->encoded_size_ = packed->encoding_.bytes;
  SavedRecord* record = packed->record_ >= 0 && static_cast<size_t>(packed->record_) < records_.size()
                            ? &records_[packed->record_]
                            : nullptr;
  if (packed->placed_) {
    const codecs::Placement placement = codecs::PlacementOf(read_back);
    if (placement.kind == codecs::PlacementKind::kArena) {
      work->relocations.push_back({packed, placement});
    } else if (placement.kind == codecs::PlacementKind::kLost) {
      // Its decode writes NaN (the step's status read says so); from the next pack on, the
      // record's encodings get their bound again, and it learns their size anew.
      if (record != nullptr) record->sized_bytes = 0;
      return;
    } else {
      packed->placed_ = false;
      work->spills.push_back(std::move(packed->spill_));
    }
  } else if (packed->encoded_size_ < packed->buffer_->size()) {
    work->shrinks.push_back({packed, packed->encoded_size_});
  }
  if (size_decided && record != nullptr) {
    record->sized_spec = packed->spec_;
    record->sized_bytes = packed->encoded_size_;
    largest_sized_bytes_ = std::max<uint64_t>(largest_sized_bytes_, packed->encoded_size_);
  }
}

void Session::ResolveReady(int device, Deferred* work) {
  auto queue = unresolved_.find(device);
  if (queue == unresolved_.end()) return;
  while (!queue->second.empty()) {
    std::shared_ptr<PackedTensor> packed = queue->second.front().lock();
    work->keep.push_back(packed);  // its last reference must not drop while mu_ is held
    if (packed == nullptr) {
      queue->second.pop_front();
      continue;
    }
    // In encode order on a stream: the first one not done means the rest are not either.
    if (!packed->status_pool_->Ready(packed->slot_)) break;
    queue->second.pop_front();
    Resolve(packed, packed->status_pool_->Mirror(packed->slot_), work);
  }
}

void Session::Finish(Deferred& work) {
  // A shrink is a copy into a smaller allocation, on the buffer's own stream, behind its
  // encode: an allocation that may run the pressure callbacks, so with no lock held. One that
  // fails (no room even for the smaller copy) leaves the buffer as it was.
  for (Shrink& shrink : work.shrinks) {
    CheckNoneHeld("shrinking a packed tensor's buffer");
    PackedTensor& packed = *shrink.packed;
    const uint64_t before = packed.buffer_->size();
    if (!packed.buffer_->ShrinkTo(shrink.bytes).ok()) continue;
    const uint64_t after = packed.buffer_->size();
    if (after >= before) continue;
    CheckedLock lock(&mu_);
    packed.stored_bytes_ = after;
    const uint64_t freed = before - after;
    totals_.live_stored -= std::min(totals_.live_stored, freed);
    totals_.packed_stored_bytes -= std::min(totals_.packed_stored_bytes, freed);
    current_step_.stored_bytes -= std::min(current_step_.stored_bytes, freed);
    if (packed.record_ >= 0 && static_cast<size_t>(packed.record_) < records_.size()) {
      SavedRecord& record = records_[packed.record_];
      record.stored_bytes = after;
      if (record.assigned.automatic && !record.lossless) {
        current_step_.automatic_bytes -= std::min(current_step_.automatic_bytes, freed);
      }
    }
  }
  work.shrinks.clear();
  // An encoding in the spill room moves to a buffer of its size, on its own stream; the room
  // goes back once no tensor is in it. One that finds no memory stays where it is (its decodes
  // read it there).
  for (Relocation& relocation : work.relocations) {
    CheckNoneHeld("moving an encoding out of the spill room");
    PackedTensor& packed = *relocation.packed;
    codecs::ExecContext context;
    context.device = codecs::Device::kCuda;
    context.device_index = packed.device_index_;
    context.stream = packed.stream_;
    absl::StatusOr<std::unique_ptr<Buffer>> exact = factory_(packed.encoded_size_, context);
    if (!exact.ok()) continue;
    const absl::Status copied = codecs::CopyPlaced(
        relocation.placement, packed.encoded_size_, packed.buffer_->data(),
        packed.buffer_->size(), packed.spill_->arena, (*exact)->data(), (*exact)->size(), context);
    if (!copied.ok()) continue;
    const uint64_t before = packed.buffer_->size();
    std::unique_ptr<Buffer> predicted = std::exchange(packed.buffer_, std::move(*exact));
    std::shared_ptr<SpillRoom> room = std::move(packed.spill_);
    packed.placed_ = false;
    const uint64_t after = packed.buffer_->size();
    CheckedLock lock(&mu_);
    packed.stored_bytes_ = after;
    // Counted as the predicted buffer until now; the spill room is counted by the allocator.
    totals_.live_stored = totals_.live_stored - std::min(totals_.live_stored, before) + after;
    current_step_.stored_bytes =
        current_step_.stored_bytes - std::min(current_step_.stored_bytes, before) + after;
    if (packed.record_ >= 0 && static_cast<size_t>(packed.record_) < records_.size()) {
      records_[packed.record_].stored_bytes = after;
    }
  }
  work.relocations.clear();
  work.spills.clear();
  // The samples' copies are complete (the status read that handed them over waited for them).
  for (PendingSample& sample : work.samples) {
    for (size_t i = 0; i < sample.candidates.size(); ++i) {
      RecordMeasurement(sample.record, i,
                        MeasureOnHost(sample.host, sample.full_numel, sample.candidates[i]));
    }
    sample.pool->ReleaseSample(sample.staged);
  }
  work.samples.clear();
  work.keep.clear();
}

absl::Status Session::CheckDeferred(Deferred* work) {
  if (deferred_this_step_.empty() && pending_samples_.empty()) return absl::OkStatus();
  for (auto& [device, pool] : status_pools_) {
    absl::Status collected = pool->Collect();
    if (!collected.ok()) return collected;
    totals_.codec_nanoseconds += pool->TakeCodecNanoseconds();
  }
  ++totals_.device_status_reads;
  std::string corrupt;
  for (const DeferredUse& use : deferred_this_step_) {
    const codecs::DeviceStatus& read = use.pool->Mirror(use.slot);
    SavedRecord* record = use.record >= 0 && static_cast<size_t>(use.record) < records_.size()
                              ? &records_[use.record]
                              : nullptr;
    std::shared_ptr<PackedTensor> packed = use.packed.lock();
    work->keep.push_back(packed);  // its last reference must not drop while mu_ is held
    if (packed != nullptr && packed->encoding_.device_decided) {
      Resolve(packed, read, work);
    } else if (!use.decode && use.header.payload_size == 0 && record != nullptr) {
      // Released before the host saw its size (its backward has run): what it told is kept
      // for its record's next pack, as Resolve keeps it.
      if (codecs::PlacementOf(read).kind == codecs::PlacementKind::kLost) {
        record->sized_bytes = 0;
      } else {
        record->sized_spec = use.spec;
        record->sized_bytes = codecs::kHeaderSize + read.payload_bytes;
        largest_sized_bytes_ = std::max<uint64_t>(largest_sized_bytes_, record->sized_bytes);
      }
    }
    if ((read.nonfinite != 0 || read.unrepresentable != 0) && record != nullptr) {
      // The decode wrote NaN for it (the step's gradients are not finite: GradScaler skips the
      // step); from the next step on it is kept exact.
      const absl::Status refused = codecs::CheckEncode(use.header, read);
      if (!record->device_flagged) ++totals_.exact_fallbacks;
      record->device_flagged = true;
      record->reason = KeepReason::kNonFiniteOnDevice;
      record->note = absl::StrCat(refused.message(), " (on the GPU: decoded as NaN at step ",
                                  step_index_, ", kept exact from the next step)");
    }
    if ((read.failures & codecs::kFailLost) != 0 && corrupt.empty()) {
      corrupt = absl::StrCat(
          "actpack: saved tensor #", record != nullptr ? record->ordinal : -1,
          record != nullptr ? absl::StrCat(" (", record->producer, " in module '", record->module,
                                           "')")
                            : "",
          " outgrew the buffer its last step's size gave it, and the spill room beside it; its "
          "decode wrote NaN, so this step's gradients are not finite; from the next step it gets "
          "room for its bound");
    }
    if ((read.failures & ~uint64_t{codecs::kFailUnrepresentable}) != 0 && corrupt.empty()) {
      corrupt = absl::StrCat(
          "actpack: saved tensor #", record != nullptr ? record->ordinal : -1,
          record != nullptr ? absl::StrCat(" (", record->producer, " in module '", record->module,
                                           "')")
                            : "",
          " was corrupted between its pack and its unpack (",
          codecs::DescribeFailures(read.failures),
          "); its decode wrote NaN, so this step's gradients are not finite");
    }
    if (use.decode) use.pool->Release(use.slot);
  }
  deferred_this_step_.clear();
  unresolved_.clear();
  for (PendingSample& sample : pending_samples_) work->samples.push_back(std::move(sample));
  pending_samples_.clear();
  if (!corrupt.empty()) return absl::DataLossError(corrupt);
  return absl::OkStatus();
}

absl::Status Session::Unpack(const PackedTensor& packed, const codecs::MutableTensorView& output,
                             const codecs::ExecContext& context) {
  // Backward may run on another stream than the forward that packed: the buffer must outlive
  // the decode queued there, not just the handle (which autograd may drop right after).
  if (context.device == codecs::Device::kCuda && context.stream != packed.stream_) {
    absl::Status recorded = packed.buffer_->RecordStream(context.stream);
    // A placed encoding may be in the spill room: it is read on this stream too.
    if (recorded.ok() && packed.spill_ != nullptr) {
      recorded = packed.spill_->memory->RecordStream(context.stream);
    }
    if (!recorded.ok()) return recorded;
  }
  if (packed.deferred_) return UnpackDeferred(packed, output, context);
  const auto decode_start = std::chrono::steady_clock::now();
  absl::Status status =
      codecs::Decode(packed.data(), packed.encoded_size(), output, context);
  const uint64_t decode_ns = NanosecondsSince(decode_start);
  if (status.ok()) {
    CheckedLock lock(&mu_);
    totals_.codec_nanoseconds += decode_ns;
    ++totals_.unpacks;
  }
  return status;
}

absl::Status Session::UnpackDeferred(const PackedTensor& packed,
                                     const codecs::MutableTensorView& output,
                                     const codecs::ExecContext& context) {
  DeviceStatusPool& pool = *packed.status_pool_;
  // The decode's own status (see DeviceStatusPool::CopyStatus), taken with no lock held.
  absl::StatusOr<DeviceStatusPool::Slot> slot = pool.Acquire(context);
  if (!slot.ok()) return slot.status();
  Deferred work;
  absl::Status status = absl::OkStatus();
  bool timed = false;
  {
    CheckedLock lock(&mu_);
    // What the device decided is read there by the decode (Codec::ReadsDeviceParams): the host
    // completes what has reached it, and waits for nothing.
    if (packed.encoding_.device_decided) ResolveReady(packed.device_index_, &work);
    // The codecs' time on the device is measured on profile steps (events around the calls,
    // read at the step's end): the steps the policy measures its candidates on.
    timed = IsProfileStep(step_index_, options_.profile_every);
  }
  // A shrink or a move of this very buffer, if it was found resolved, is queued before its
  // decode.
  Finish(work);
  if (status.ok()) {
    pool.UseStream(context.stream);
    status = pool.Order(context.stream, packed.stream_);
  }
  if (status.ok()) status = pool.CopyStatus(packed.slot_, *slot, context.stream);
  // A placed encoding whose place the host has not read: gathered into room for its bound.
  const uint8_t* encoded = packed.buffer_->data();
  std::unique_ptr<Buffer> gathered;
  if (status.ok() && packed.placed_ && packed.encoding_.device_decided) {
    CheckNoneHeld("allocating room to gather an encoding");
    absl::StatusOr<std::unique_ptr<Buffer>> room = factory_(packed.encoding_.bytes, context);
    status = room.ok() ? codecs::GatherDeferred(packed.buffer_->data(), packed.buffer_->size(),
                                                packed.spill_->arena, slot->device,
                                                (*room)->data(), (*room)->size(), context)
                       : room.status();
    if (room.ok()) gathered = std::move(*room);
    if (gathered != nullptr) encoded = gathered->data();
  } else if (packed.placed_) {
    // Resolved, still in the spill room (no memory to move it out): decoded where it is.
    encoded = codecs::PlacedBytes(codecs::PlacementOf(pool.Mirror(packed.slot_)),
                                  packed.buffer_->data(), packed.spill_->arena);
    if (encoded == nullptr) encoded = packed.buffer_->data();  // lost: the decode writes NaN
  }
  if (status.ok() && timed) {
    status = pool.TimeBegin(*slot, DeviceStatusPool::kDecode, context.stream);
  }
  if (status.ok()) {
    status = codecs::DecodeDeferred(packed.encoding_, encoded, output, context, slot->device);
  }
  if (status.ok() && timed) {
    status = pool.TimeEnd(*slot, DeviceStatusPool::kDecode, context.stream);
  }
  gathered.reset();  // free in stream order, after the decode read it
  if (!status.ok()) {
    pool.Release(*slot);  // free after the next status read, which orders what was queued on it
    return status;
  }
  CheckedLock lock(&mu_);
  deferred_this_step_.push_back(DeferredUse{packed.status_pool_, *slot, packed.record_,
                                            packed.encoding_.header, {}, /*decode=*/true, {}});
  ++totals_.unpacks;
  return absl::OkStatus();
}

void Session::OnRelease(const PackedTensor& packed) {
  CheckedLock lock(&mu_);
  totals_.live_stored -= packed.stored_bytes_;
  totals_.live_raw -= packed.raw_bytes_;
}

absl::Status Session::EndStep(uint64_t peak_bytes, uint64_t reserved_bytes,
                              uint64_t system_bytes) {
  // The step's one read of its GPU statuses: what it finds is said after the step is recorded.
  // Its shrinks and the profile samples it completed are done before the plan.
  Deferred work;
  absl::Status checked;
  {
    CheckedLock lock(&mu_);
    checked = CheckDeferred(&work);
    // The step's spill rooms go back once no packed tensor is in them (relocated above).
    for (auto& [key, room] : spill_rooms_) work.spills.push_back(std::move(room));
    spill_rooms_.clear();
  }
  Finish(work);
  CheckedLock lock(&mu_);
  if (ordinal_ == 0) return checked;
  current_step_.peak_bytes = peak_bytes;
  current_step_.peak_reserved_bytes = reserved_bytes;
  current_step_.system_peak_bytes = system_bytes;
  const uint64_t counted = reserved_bytes + options_.outside_allowance_bytes;
  if (system_bytes > counted && reserved_bytes > 0) {
    policy_.outside_pool_bytes = std::max(policy_.outside_pool_bytes, system_bytes - counted);
  }
  // Only a step where the cap bound (the pool ran out even after giving back its cache) says
  // what fragmentation costs; otherwise reserved includes cache the pool would have released,
  // and planning for it would make the policy harsher than the budget requires.
  if (relieving_this_step_ && reserved_bytes > 0 && peak_bytes > 0) {
    policy_.fragmentation = std::max(1.0, static_cast<double>(reserved_bytes) /
                                              static_cast<double>(peak_bytes));
  }
  absl::Status status = absl::OkStatus();
  if (current_step_.profiled) profiled_since_plan_ = true;
  const bool has_policy = profiled_since_plan_ || current_step_.automatic_bytes > 0;
  // The first step is a warm-up: it profiles the codecs under the safe default, but its peak
  // misses what the first optimizer step allocates (its state), so the first plan waits for
  // the second step. Then re-plan after each profile step and whenever the peak came within
  // half the headroom of the budget (the model of the step was off).
  if (has_policy && options_.budget_bytes > 0 && peak_bytes > 0 && step_index_ >= 1) {
    const uint64_t close = UsableBytes(PlanningBudget(), options_.headroom / 2);
    // The pool reserved within half the headroom of the budget: full, as far as the plan goes.
    const bool pool_full = reserved_bytes >= UsableBytes(PoolBudget(), options_.headroom / 2);
    if (profiled_since_plan_ || relieving_this_step_ || peak_bytes > close) {
      status = Replan(peak_bytes, pool_full);
      profiled_since_plan_ = false;
    }
  }
  relieving_this_step_ = false;
  current_step_.index = step_index_;
  totals_.steps = step_index_ + 1;
  if (first_steps_.size() < kStepsKept) {
    first_steps_.push_back(current_step_);
  } else {
    last_steps_.push_back(current_step_);
    if (last_steps_.size() > kStepsKept) last_steps_.pop_front();
  }
  current_step_ = StepRecord{};
  step_records_.clear();
  ordinal_ = 0;
  largest_saved_this_step_ = 0;
  ++step_index_;
  absl::erase_if(dedup_, [](auto& key_entries) {
    std::vector<DedupEntry>& entries = key_entries.second;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const DedupEntry& e) { return e.packed.expired(); }),
                  entries.end());
    return entries.empty();
  });
  return checked.ok() ? status : checked;
}

SessionTotals Session::Totals() const {
  CheckedLock lock(&mu_);
  return totals_;
}

PolicyState Session::Policy() const {
  CheckedLock lock(&mu_);
  return policy_;
}

std::vector<SavedRecord> Session::Records() const {
  CheckedLock lock(&mu_);
  return records_;
}

std::vector<StepRecord> Session::KeptStepsLocked() const {
  std::vector<StepRecord> steps(first_steps_);
  steps.insert(steps.end(), last_steps_.begin(), last_steps_.end());
  return steps;
}

std::vector<StepRecord> Session::Steps() const {
  CheckedLock lock(&mu_);
  return KeptStepsLocked();
}

uint64_t Session::LiveStatusSlots() const {
  CheckedLock lock(&mu_);
  uint64_t live = 0;
  for (const auto& [device, pool] : status_pools_) live += pool->slots_in_use();
  return live;
}

SessionState Session::State() const {
  CheckedLock lock(&mu_);
  SessionState state{options_, totals_, policy_, records_, KeptStepsLocked(),
                     gradients_.measured(), {}};
  if (state.gradient_sensitivity) {
    for (const SavedRecord& record : records_) {
      state.sensitivity.push_back(gradients_.WeightOf(record.module));
    }
  }
  return state;
}

}  // namespace actpack::runtime
