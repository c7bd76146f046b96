#include "runtime/session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codecs/registry.h"

namespace actpack::runtime {

// Links packed tensors to their session. A packed tensor can outlive the session (autograd
// keeps the graph after the budget context exits); the session detaches itself on destruction.
struct PackedTensor::Ledger {
  absl::Mutex mu;
  Session* session ABSL_GUARDED_BY(mu) = nullptr;
};

namespace {

codecs::CodecParams IdentityParams() {
  codecs::CodecParams params;
  params.codec = codecs::CodecId::kIdentity;
  return params;
}

// The log-probabilities a cross-entropy loss saves: backward exponentiates them, so any error
// there lands in the gradient of every logit (2-bit log-probs made training diverge).
bool IsLossInput(const std::string& producer) { return producer == "LogSoftmaxBackward0"; }

json::Value ShapeJson(const std::vector<int64_t>& shape) {
  json::Value array = json::Value::Array();
  for (int64_t d : shape) array.Append(d);
  return array;
}

double Ratio(uint64_t raw, uint64_t stored) {
  return stored == 0 ? 0.0 : static_cast<double>(raw) / static_cast<double>(stored);
}

}  // namespace

uint64_t SavedTensorInfo::Bytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n * codecs::ElementSize(dtype);
}

absl::string_view KeepReasonName(KeepReason reason) {
  switch (reason) {
    case KeepReason::kNone: return "";
    case KeepReason::kDisabled: return "packing disabled";
    case KeepReason::kParameter: return "parameter (or a view of one)";
    case KeepReason::kNotFloatingPoint: return "not floating point";
    case KeepReason::kTooSmall: return "below min_bytes";
    case KeepReason::kLossInput: return "log-probabilities of the loss";
  }
  return "";
}

PackedTensor::~PackedTensor() {
  if (ledger_ == nullptr) return;
  absl::MutexLock lock(&ledger_->mu);
  if (ledger_->session != nullptr) ledger_->session->OnRelease(*this);
}

Session::Session(SessionOptions options, BufferFactory factory)
    : options_(std::move(options)),
      factory_(std::move(factory)),
      ledger_(std::make_shared<PackedTensor::Ledger>()) {
  absl::MutexLock lock(&ledger_->mu);
  ledger_->session = this;
}

Session::~Session() {
  absl::MutexLock lock(&ledger_->mu);
  ledger_->session = nullptr;
}

int Session::RecordFor(const SavedTensorInfo& info, int ordinal) {
  auto key = std::make_tuple(ordinal, info.producer, info.shape);
  auto it = record_index_.find(key);
  if (it != record_index_.end()) return it->second;
  SavedRecord record;
  record.ordinal = ordinal;
  record.producer = info.producer;
  record.shape = info.shape;
  record.dtype = info.dtype;
  records_.push_back(std::move(record));
  record_index_.emplace(std::move(key), static_cast<int>(records_.size() - 1));
  return static_cast<int>(records_.size() - 1);
}

PackPlan Session::Plan(const SavedTensorInfo& info) {
  absl::MutexLock lock(&mu_);
  PackPlan plan;
  plan.record = RecordFor(info, ordinal_++);
  SavedRecord& record = records_[plan.record];
  const uint64_t bytes = info.Bytes();
  current_step_.saved_raw_bytes += bytes;
  record.raw_bytes = bytes;
  ++record.occurrences;

  if (!options_.enabled) {
    plan.reason = KeepReason::kDisabled;
  } else if (info.is_parameter) {
    plan.reason = KeepReason::kParameter;
  } else if (!info.supported_dtype || !codecs::IsLossyFloat(info.dtype)) {
    plan.reason = KeepReason::kNotFloatingPoint;
  } else if (bytes < options_.min_bytes) {
    plan.reason = KeepReason::kTooSmall;
  } else if (IsLossInput(info.producer)) {
    plan.reason = KeepReason::kLossInput;
  }
  if (plan.reason != KeepReason::kNone) {
    plan.action = PackAction::kKeep;
    record.codec = "kept";
    record.note = std::string(KeepReasonName(plan.reason));
    totals_.kept_bytes += bytes;
    current_step_.stored_bytes += bytes;
    return plan;
  }

  const DedupKey key{info.storage, info.storage_offset, info.shape, info.strides, info.version,
                     info.dtype};
  auto it = dedup_.find(key);
  if (it != dedup_.end()) {
    if (std::shared_ptr<PackedTensor> earlier = it->second.lock()) {
      plan.action = PackAction::kReuse;
      plan.duplicate = std::move(earlier);
      ++record.reused;
      totals_.reused_bytes += bytes;
      return plan;
    }
    dedup_.erase(it);
  }
  plan.action = PackAction::kPack;
  plan.params = options_.codec;
  plan.params.seed = options_.seed + pack_counter_++;
  return plan;
}

absl::StatusOr<std::shared_ptr<PackedTensor>> Session::Pack(const SavedTensorInfo& info,
                                                            const PackPlan& plan,
                                                            const codecs::TensorView& contiguous,
                                                            const codecs::ExecContext& context) {
  codecs::CodecParams params = plan.params;
  std::string note;
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(contiguous.Spec(), params);
  if (!capacity.ok()) return capacity.status();
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = factory_(*capacity, context);
  if (!buffer.ok()) return buffer.status();
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

  auto packed = std::shared_ptr<PackedTensor>(new PackedTensor());
  packed->shape_ = info.shape;
  packed->dtype_ = info.dtype;
  packed->raw_bytes_ = info.Bytes();
  packed->stored_bytes_ = (*buffer)->size();
  packed->encoded_size_ = *used;
  packed->storage_guard_ = info.storage_guard;
  packed->buffer_ = std::move(*buffer);

  absl::MutexLock lock(&mu_);
  packed->ledger_ = ledger_;
  SavedRecord& record = records_[plan.record];
  record.codec = codecs::FormatCodecSpec(params);
  record.stored_bytes = packed->stored_bytes_;
  if (!note.empty()) {
    record.note = note;
    ++totals_.exact_fallbacks;
  }
  ++totals_.packs;
  totals_.packed_raw_bytes += packed->raw_bytes_;
  totals_.packed_stored_bytes += packed->stored_bytes_;
  totals_.live_stored += packed->stored_bytes_;
  totals_.live_raw += packed->raw_bytes_;
  totals_.peak_live_stored = std::max(totals_.peak_live_stored, totals_.live_stored);
  totals_.peak_live_raw = std::max(totals_.peak_live_raw, totals_.live_raw);
  current_step_.stored_bytes += packed->stored_bytes_;
  if (totals_.live_stored > current_step_.peak_live_stored) {
    current_step_.peak_live_stored = totals_.live_stored;
    current_step_.peak_live_raw = totals_.live_raw;
  }
  const DedupKey key{info.storage, info.storage_offset, info.shape, info.strides, info.version,
                     info.dtype};
  dedup_[key] = packed;
  return packed;
}

absl::Status Session::Unpack(const PackedTensor& packed, const codecs::MutableTensorView& output,
                             const codecs::ExecContext& context) {
  absl::Status status =
      codecs::Decode(packed.data(), packed.encoded_size(), output, context);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    ++totals_.unpacks;
  }
  return status;
}

void Session::OnRelease(const PackedTensor& packed) {
  absl::MutexLock lock(&mu_);
  totals_.live_stored -= packed.stored_bytes_;
  totals_.live_raw -= packed.raw_bytes_;
}

void Session::EndStep() {
  absl::MutexLock lock(&mu_);
  if (ordinal_ == 0) return;
  steps_.push_back(current_step_);
  current_step_ = StepRecord{};
  ordinal_ = 0;
  for (auto it = dedup_.begin(); it != dedup_.end();) {
    it = it->second.expired() ? dedup_.erase(it) : std::next(it);
  }
}

SessionTotals Session::Totals() const {
  absl::MutexLock lock(&mu_);
  return totals_;
}

std::vector<SavedRecord> Session::Records() const {
  absl::MutexLock lock(&mu_);
  return records_;
}

std::vector<StepRecord> Session::Steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

json::Value Session::ActivationReport() const {
  absl::MutexLock lock(&mu_);
  json::Value report = json::Value::Object();
  report.Set("codec", codecs::FormatCodecSpec(options_.codec));
  report.Set("min_bytes", options_.min_bytes);
  report.Set("enabled", options_.enabled);
  json::Value totals = json::Value::Object();
  totals.Set("packed_raw_bytes", totals_.packed_raw_bytes);
  totals.Set("packed_stored_bytes", totals_.packed_stored_bytes);
  totals.Set("ratio", Ratio(totals_.packed_raw_bytes, totals_.packed_stored_bytes));
  totals.Set("kept_bytes", totals_.kept_bytes);
  totals.Set("reused_bytes", totals_.reused_bytes);
  totals.Set("packs", totals_.packs);
  totals.Set("unpacks", totals_.unpacks);
  totals.Set("exact_fallbacks", totals_.exact_fallbacks);
  totals.Set("peak_live_stored_bytes", totals_.peak_live_stored);
  totals.Set("peak_live_raw_bytes", totals_.peak_live_raw);
  report.Set("totals", std::move(totals));

  json::Value steps = json::Value::Array();
  for (const StepRecord& step : steps_) {
    json::Value s = json::Value::Object();
    s.Set("saved_raw_bytes", step.saved_raw_bytes);
    s.Set("stored_bytes", step.stored_bytes);
    s.Set("ratio", Ratio(step.saved_raw_bytes, step.stored_bytes));
    s.Set("peak_live_stored_bytes", step.peak_live_stored);
    s.Set("peak_live_raw_bytes", step.peak_live_raw);
    steps.Append(std::move(s));
  }
  report.Set("steps", std::move(steps));

  json::Value saved = json::Value::Array();
  for (const SavedRecord& record : records_) {
    json::Value r = json::Value::Object();
    r.Set("ordinal", record.ordinal);
    r.Set("producer", record.producer);
    r.Set("shape", ShapeJson(record.shape));
    r.Set("dtype", codecs::DTypeName(record.dtype));
    r.Set("codec", record.codec.empty() ? std::string("reused") : record.codec);
    r.Set("raw_bytes", record.raw_bytes);
    r.Set("stored_bytes", record.stored_bytes);
    r.Set("ratio", Ratio(record.raw_bytes, record.stored_bytes));
    r.Set("occurrences", record.occurrences);
    r.Set("reused", record.reused);
    if (!record.note.empty()) r.Set("note", record.note);
    saved.Append(std::move(r));
  }
  report.Set("saved_tensors", std::move(saved));
  return report;
}

}  // namespace actpack::runtime
