// The session: what happens to each tensor autograd saves for backward.
//
// The PyTorch plugin describes a saved tensor (SavedTensorInfo) and asks for a plan: keep it as
// it is (parameters, integer and bool tensors, tensors under a size threshold), reuse the
// packed copy of the same tensor saved earlier in the step (dedup), or pack it with a codec.
// Pack encodes into a buffer from the BufferFactory (the plugin's allocator) and returns a
// PackedTensor; Unpack decodes it into an output the plugin allocated. The session counts
// bytes raw vs stored per saved tensor and overall, the live and peak stored bytes, and turns
// all of it into the run report (report.h).
//
// A step ends when the caller says so (EndStep; the plugin calls it when a backward pass
// finishes); the ordinal of a saved tensor within its step keys it across steps.
//
// Usage (the plugin does this from saved_tensors_hooks):
//   Session session(options, factory);
//   PackPlan plan = session.Plan(info);
//   if (plan.action == PackAction::kPack) packed = *session.Pack(info, plan, view, context);
//   ... later: session.Unpack(*packed, output_view, context);
#ifndef ACTPACK_RUNTIME_SESSION_H_
#define ACTPACK_RUNTIME_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "runtime/json.h"

namespace actpack::runtime {

// Memory that holds one encoded tensor. The plugin backs it with a torch tensor, so the bytes
// come from (and are counted by) the same allocator as the rest of the step.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
};

using BufferFactory = std::function<absl::StatusOr<std::unique_ptr<Buffer>>(
    size_t bytes, const codecs::ExecContext& context)>;

struct SessionOptions {
  codecs::CodecParams codec;     // the codec every packed tensor gets
  uint64_t min_bytes = 64 * 1024;  // tensors below this stay as they are
  uint64_t seed = 0;             // stochastic rounding draws from seed + a per-pack counter
  bool enabled = true;           // false: plan every tensor as kept (exact parity runs)
};

// Everything the session needs to know about a saved tensor, gathered before any copy.
struct SavedTensorInfo {
  codecs::DType dtype = codecs::DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  codecs::Device device = codecs::Device::kCpu;
  int device_index = 0;
  bool is_parameter = false;  // a parameter or buffer of the model: it lives anyway
  bool supported_dtype = true;  // false for dtypes the plugin cannot describe
  // Identity of the saved data, for dedup: the same storage, offset, shape, strides and
  // version is the same tensor. `storage` must name the storage object, not its data pointer
  // (freed data is handed out again at the same address); `storage_guard` keeps that name
  // from being reused while a packed copy exists (the plugin holds a weak reference to the
  // storage object in it).
  uintptr_t storage = 0;
  std::shared_ptr<const void> storage_guard;
  int64_t storage_offset = 0;
  uint32_t version = 0;
  std::string producer;  // the autograd node that saved it, e.g. "ConvolutionBackward0"

  uint64_t Bytes() const;
};

enum class PackAction { kKeep, kReuse, kPack };

// Why a tensor is kept as it is. Values are the report's strings.
enum class KeepReason { kNone, kDisabled, kParameter, kNotFloatingPoint, kTooSmall, kLossInput };

class PackedTensor;

struct PackPlan {
  PackAction action = PackAction::kKeep;
  KeepReason reason = KeepReason::kNone;
  codecs::CodecParams params;
  std::shared_ptr<PackedTensor> duplicate;  // kReuse: the earlier packed copy
  int record = -1;                          // index into the session's records
};

class Session;

// One encoded saved tensor. Releasing the last reference returns its bytes to the allocator
// and updates the session's live byte counts.
class PackedTensor {
 public:
  PackedTensor(const PackedTensor&) = delete;
  PackedTensor& operator=(const PackedTensor&) = delete;
  ~PackedTensor();

  const std::vector<int64_t>& shape() const { return shape_; }
  codecs::DType dtype() const { return dtype_; }
  uint64_t raw_bytes() const { return raw_bytes_; }
  uint64_t stored_bytes() const { return stored_bytes_; }
  const uint8_t* data() const { return buffer_->data(); }
  size_t encoded_size() const { return encoded_size_; }

 private:
  friend class Session;
  struct Ledger;
  PackedTensor() = default;

  std::shared_ptr<Ledger> ledger_;
  std::shared_ptr<const void> storage_guard_;
  std::unique_ptr<Buffer> buffer_;
  std::vector<int64_t> shape_;
  codecs::DType dtype_ = codecs::DType::kFloat32;
  uint64_t raw_bytes_ = 0;
  uint64_t stored_bytes_ = 0;
  size_t encoded_size_ = 0;
};

// Per saved-tensor record: the same position of the step across steps folds into one record.
struct SavedRecord {
  int ordinal = 0;  // position among the step's saved tensors
  std::string producer;
  std::vector<int64_t> shape;
  codecs::DType dtype = codecs::DType::kFloat32;
  std::string codec;  // "quant2", "identity", or "kept"
  std::string note;   // why kept, or why packed exactly
  uint64_t raw_bytes = 0;     // per occurrence
  uint64_t stored_bytes = 0;  // per occurrence (0 when kept or reused)
  uint64_t occurrences = 0;
  uint64_t reused = 0;  // times a duplicate save reused an earlier copy
};

struct StepRecord {
  uint64_t saved_raw_bytes = 0;    // what autograd would have kept without actpack
  uint64_t stored_bytes = 0;       // what actpack kept instead (packed + kept)
  uint64_t peak_live_stored = 0;   // peak of live packed bytes during the step
  uint64_t peak_live_raw = 0;      // the same tensors' raw bytes at that moment
};

struct SessionTotals {
  uint64_t packed_raw_bytes = 0;
  uint64_t packed_stored_bytes = 0;
  uint64_t kept_bytes = 0;
  uint64_t reused_bytes = 0;
  uint64_t packs = 0;
  uint64_t unpacks = 0;
  uint64_t exact_fallbacks = 0;
  uint64_t live_stored = 0;
  uint64_t peak_live_stored = 0;
  uint64_t live_raw = 0;
  uint64_t peak_live_raw = 0;
};

class Session {
 public:
  Session(SessionOptions options, BufferFactory factory);
  ~Session();

  const SessionOptions& options() const { return options_; }

  PackPlan Plan(const SavedTensorInfo& info);

  // Encodes `contiguous` (the saved tensor's data, made contiguous by the caller) as planned.
  // A tensor the codec cannot encode (non-finite values) is packed exactly with `identity`.
  absl::StatusOr<std::shared_ptr<PackedTensor>> Pack(const SavedTensorInfo& info,
                                                     const PackPlan& plan,
                                                     const codecs::TensorView& contiguous,
                                                     const codecs::ExecContext& context);

  absl::Status Unpack(const PackedTensor& packed, const codecs::MutableTensorView& output,
                      const codecs::ExecContext& context);

  // Closes the current step (a forward and its backward): records its totals and restarts the
  // ordinals. A step in which nothing was saved is not recorded.
  void EndStep();

  SessionTotals Totals() const;
  std::vector<SavedRecord> Records() const;
  std::vector<StepRecord> Steps() const;

  // The report's "activations" section: totals, per-step and per saved tensor.
  json::Value ActivationReport() const;

 private:
  using DedupKey = std::tuple<uintptr_t, int64_t, std::vector<int64_t>, std::vector<int64_t>,
                              uint32_t, codecs::DType>;
  int RecordFor(const SavedTensorInfo& info, int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRelease(const PackedTensor& packed);

  const SessionOptions options_;
  const BufferFactory factory_;
  std::shared_ptr<PackedTensor::Ledger> ledger_;

  mutable absl::Mutex mu_;
  uint64_t pack_counter_ ABSL_GUARDED_BY(mu_) = 0;
  int ordinal_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<DedupKey, std::weak_ptr<PackedTensor>> dedup_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<int, std::string, std::vector<int64_t>>, int> record_index_
      ABSL_GUARDED_BY(mu_);
  std::vector<SavedRecord> records_ ABSL_GUARDED_BY(mu_);
  std::vector<StepRecord> steps_ ABSL_GUARDED_BY(mu_);
  StepRecord current_step_ ABSL_GUARDED_BY(mu_);
  SessionTotals totals_ ABSL_GUARDED_BY(mu_);

  friend class PackedTensor;
};

absl::string_view KeepReasonName(KeepReason reason);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_SESSION_H_
