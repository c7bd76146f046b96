// The session: what happens to each tensor autograd saves for backward.
//
// The PyTorch plugin describes a saved tensor (SavedTensorInfo) and asks for a plan: keep it as
// it is (parameters, integer and bool tensors, tensors under a size threshold), reuse the
// packed copy of the same tensor saved earlier in the step (dedup), or pack it with a codec.
// Pack encodes into a buffer from the BufferFactory (the plugin's allocator) and returns a
// PackedTensor; Unpack decodes it into an output the plugin allocated. The session counts
// bytes raw vs stored per saved tensor and overall, the live and peak stored bytes, and turns
// all of it into the run report (report/writer.h).
//
// A step ends when the caller says so (EndStep; the plugin calls it when a backward pass
// finishes); the ordinal of a saved tensor within its step keys it across steps.
//
// Usage (the plugin does this from saved_tensors_hooks):
//   Session session(options, factory);
//   PackPlan plan = session.Plan(info);
//   session.MeasureCandidates(plan, view, context);  // a profile step's measurements
//   if (plan.action == PackAction::kPack) packed = *session.Pack(info, plan, view, context);
//   ... later: session.Unpack(*packed, output_view, context);
//
// No lock of the session is held while it allocates (buffers, statuses, a shrink's copy): an
// allocation at the budget's cap runs the pressure callbacks on the same thread, and they call
// StartRelief, ReliefPlan and Pack (common/checked_mutex.h checks it).
#ifndef ACTPACK_RUNTIME_SESSION_H_
#define ACTPACK_RUNTIME_SESSION_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "common/checked_mutex.h"
#include "codecs/deferred.h"
#include "runtime/buffer.h"
#include "runtime/device_status_pool.h"
#include "runtime/codec_choice.h"
#include "runtime/gradient_statistics.h"
#include "runtime/measurement.h"
#include "runtime/policy.h"

namespace actpack::runtime {

// Defaults of the session's options, the one place both languages take them from (actpack.budget,
// actpack::BudgetOptions and the planner read them through the bindings); the headroom's is
// policy.h's kDefaultHeadroom.
inline constexpr int kDefaultProfileEvery = 50;
inline constexpr uint64_t kDefaultMinBytes = 64 * 1024;
// The largest relative RMS error ‖x − x̂‖ / ‖x‖ the policy lets a saved tensor carry unless
// told otherwise (SessionOptions::max_rel_rms). Measured on the benchmark's ResNet-50 and
// GPT-2-like models: quant4 stays within 0.18 on every tensor, quant2 never below 0.28, and
// division between 0.03 and 0.77 by tensor; with quant2 on every tensor the ResNet-50's first
// groups' gradients fall to cosine ~0.75 against exact training, under quant4 they hold 0.98.
inline constexpr double kDefaultMaxRelRms = 0.2;

// The profile steps, one schedule for everything measured: the session measures every candidate
// codec on each saved tensor (and any tensor never measured yet), and the plugin takes its
// modules' gradient statistics, on the first kFirstProfileSteps steps (the policy's first plans
// and the error caps need them) and then every `profile_every` steps.
inline constexpr uint64_t kFirstProfileSteps = 3;
bool IsProfileStep(uint64_t step, int profile_every);

struct SessionOptions {
  CodecChoice codec;               // the default for every packed tensor
  std::vector<CodecRule> rules;    // first match wins over `codec`
  uint64_t min_bytes = kDefaultMinBytes;  // tensors below this stay as they are
  uint64_t seed = 0;               // stochastic rounding draws from seed + a per-pack counter
  bool enabled = true;             // false: plan every tensor as kept (exact parity runs)

  // The policy (automatic choices). With budget_bytes 0 there is nothing to fit: every
  // automatic tensor stays exact.
  uint64_t budget_bytes = 0;
  double headroom = kDefaultHeadroom;  // share of the budget the plan leaves free
  // What the system may count outside the allocator before it takes from the budget (on the
  // host, allocator::kHostOutsideAllowanceBytes: torch's one-time initialization).
  uint64_t outside_allowance_bytes = 0;
  int profile_every = kDefaultProfileEvery;  // steps between re-measurements of the candidates
  std::vector<codecs::CodecParams> ladder = DefaultLadder();  // candidates besides exact

  // The policy's fidelity floor: a candidate whose measured relative RMS error on a tensor is
  // above this is not taken for it (0: off). Until measured, nothing is ruled out.
  double max_rel_rms = kDefaultMaxRelRms;

  // The error-bounded mode (AC-GC): the loss may rise by at most this fraction over an exact
  // step (0: off). Each packed tensor gets an error cap from its module's gradients (see
  // ErrorCap in session.cc): an eb codec packs at exactly that bound, and the policy never
  // picks a candidate whose measured error is above it.
  double allowed_loss_increase = 0.0;

  // quant8, quant4, quant2, and division and eb where they are built in.
  static std::vector<codecs::CodecParams> DefaultLadder();
  // Each built-in codec's harshest AutoSpecs (the smallest bound), in the registry's order, as
  // FormatCodecSpec writes it: quant2, eb:rel=1e-2, division. What actpack.plan compares
  // besides none and auto.
  static std::vector<std::string> HarshestPerCodec();
};

// A tensor saved so that backward can run a region's forward again from it. A codec's error on
// it runs through every op of the recomputed region (batch norm's batch statistics, ReLU's
// masks) instead of reaching one backward: a 4-block residual CNN with batch norm, one step at
// quant4, worst parameter group's gradient cosine 0.97 with its activations packed, 0.85 with
// its blocks recomputed from packed inputs (0.99 at quant8).
enum class RegionInput {
  kNone,
  // torch.utils.checkpoint's: kept exact. What checkpointing keeps, it keeps whole (ResNet-50
  // blocks checkpointed with their inputs at quant4: worst group's cosine 0.31).
  kCheckpoint,
  // actpack.recompute's: packed, since they are all such a region keeps, but within
  // kRecomputeInputFloorShare of the fidelity floor.
  kRecompute,
};

// The share of max_rel_rms a recompute region's input may carry. On the CNN above, with its
// blocks as regions: inputs at quant8 (relative RMS error 0.005) held cosine 0.99, at
// eb:rel=1e-2 (0.029) 0.94, at quant4 (0.082) 0.85. A tenth of the default 0.2 admits the first
// and rules out the others.
inline constexpr double kRecomputeInputFloorShare = 0.1;

// Everything the session needs to know about a saved tensor, gathered before any copy.
struct SavedTensorInfo {
  codecs::DType dtype = codecs::DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  codecs::Device device = codecs::Device::kCpu;
  int device_index = 0;
  bool is_parameter = false;  // a parameter or buffer of the model: it lives anyway
  bool is_view = false;       // a view of another tensor (a slice of the user's data, say)
  // Saved while a backward pass runs: by a backward with create_graph=True for the graph a
  // later backward differentiates (double backward), or by a recomputation. Kept exact: its
  // error would reach the gradients twice, and a recomputed tensor is unpacked at once.
  bool in_backward = false;
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
  std::string producer;  // the autograd node of the op that made it, e.g. "ConvolutionBackward0"
  // Saved by ReLU for its own backward, which reads it only as `output <= 0`: packed as that
  // mask (PackPlan::sign_mask). The plugin knows it from the node saving it; `producer` names
  // the node that made the tensor, and the next layer's save of it has the same one.
  bool sign_only = false;
  // An input of a region that backward runs again from it (RegionInput).
  RegionInput region_input = RegionInput::kNone;
  std::string module;    // the module running when it was saved, e.g. "layer1.0.conv1"

  uint64_t Bytes() const;
};

enum class PackAction { kKeep, kReuse, kPack };

// Why a tensor is stored exactly: kept as it is, or (kNonFinite) packed by identity. The report
// writes a code for each (KeepReasonCode: what tests and tools match) beside a sentence
// (KeepReasonName, or the codec's own message); each value is named as its code.
enum class KeepReason {
  kNone, kDisabled, kCodecNone, kParameter, kNotFloatingPoint, kBelowMinBytes, kLossInput,
  kFitsBudget, kSavedInBackward, kAwaitingErrorBound, kStatistics, kCheckpointInput,
  // Its codec met values it cannot hold (non-finite values) in an earlier step on a GPU, where
  // it is packed without waiting to know: that step decoded NaN, the later ones keep it exact.
  kNonFiniteOnDevice,
  // Its codec refused its values (non-finite) when packing on the host: packed by identity.
  kNonFinite
};

class PackedTensor;

// A step's room, per device and stream, for encodings that outgrow the buffer their size was
// predicted for (codecs::SpillArena); it lives while a packed tensor in it does.
struct SpillRoom {
  std::unique_ptr<Buffer> memory;  // the arena, then its 8-byte counter
  codecs::SpillArena arena;
};

struct PackPlan {
  PackAction action = PackAction::kKeep;
  KeepReason reason = KeepReason::kNone;
  codecs::CodecParams params;
  std::shared_ptr<PackedTensor> duplicate;  // kReuse: the earlier packed copy
  int record = -1;                          // index into the session's records
  // Codecs to measure on this tensor (a profile step): the plugin encodes a sample with each
  // and reports through Session::RecordMeasurement(record, i, ...).
  std::vector<codecs::CodecParams> measure;
  // Re-packing, under memory pressure, a tensor this step kept exact (ReliefPlan): Pack moves
  // its bytes from kept to packed.
  bool relief = false;
  // kPack of a tensor its reader sees only as `value <= 0` (ReLU's output, read by
  // threshold_backward): the plugin packs the bool tensor `saved <= 0` with `mask` and
  // unpacks it as 0 where set, 1 elsewhere, in the saved dtype. Never shared by dedup: another
  // reader of the same tensor (the next convolution) needs its values.
  bool sign_mask = false;
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
  codecs::CodecId codec() const { return codec_; }  // identity for an exact fallback
  bool sign_mask() const { return sign_mask_; }  // see PackPlan::sign_mask

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
  void* stream_ = nullptr;  // the stream it was packed on (its buffer's allocation stream)
  codecs::CodecId codec_ = codecs::CodecId::kIdentity;
  std::string spec_;  // the codec with its parameters ("eb:rel=1e-2")
  bool sign_mask_ = false;
  int device_index_ = 0;
  // A CUDA tensor's: packed without waiting (codecs/deferred.h), with its header as the host
  // knows it and its DeviceStatus.
  bool deferred_ = false;
  codecs::DeferredEncoding encoding_;
  std::shared_ptr<DeviceStatusPool> status_pool_;
  DeviceStatusPool::Slot slot_;
  int record_ = -1;
  // Packed into a buffer sized from the record's last encoding (codecs::PlaceDeferred): until
  // the host reads where the device put it, in `buffer_` or in the step's spill room, a decode
  // gathers it into room for its bound (encoding_.bytes) first.
  bool placed_ = false;
  std::shared_ptr<SpillRoom> spill_;
};

// Per saved-tensor record: the same position of the step across steps folds into one record.
struct SavedRecord {
  int ordinal = 0;  // position among the step's saved tensors
  std::string producer;
  std::string module;
  std::vector<int64_t> shape;
  codecs::DType dtype = codecs::DType::kFloat32;
  std::string codec;  // "quant2", "identity", or kNotPacked ("none": kept as it is)
  std::string note;   // why kept, or why packed exactly, in words (or a packed form's name)
  KeepReason reason = KeepReason::kNone;  // why stored exactly; kNone: packed by its codec
  uint64_t raw_bytes = 0;     // per occurrence
  uint64_t stored_bytes = 0;  // per occurrence (0 when kept or reused)
  uint64_t occurrences = 0;
  uint64_t reused = 0;  // times a duplicate save reused an earlier copy

  // The codec the record's tensor gets: fixed, or chosen by the policy among `candidates`
  // (index 0 is exact, then `codecs`: the ladder, and in the error-bounded mode eb at the
  // record's bound; bytes and error as last measured).
  CodecChoice assigned;
  // Packed losslessly whatever `assigned` says (`mask` for bool under auto, `bitpack` for
  // integers, the sign mask of ReLU's output): no item of the policy.
  bool lossless = false;
  // An actpack.recompute region's input: its floor is kRecomputeInputFloorShare of the rest's.
  bool recompute_input = false;
  std::vector<PolicyCandidate> candidates;
  std::vector<codecs::CodecParams> codecs;  // candidates[i + 1]'s codec
  int choice = -1;  // -1: not planned yet (the safe default: the harshest candidate)
  CodecMeasurement error;  // of the codec in use, as last measured
  uint64_t measured_step = UINT64_MAX;
  // CUDA, where the device decides the encoding's size (eb, bitpack): the last one's bytes and
  // the codec they were for. The next pack with that codec gets a buffer of this size and an
  // eighth more, instead of the codec's bound (Session::PackDeferred); 0: not known, or the
  // last one outgrew its buffer and the spill room beside it.
  std::string sized_spec;
  uint64_t sized_bytes = 0;
  bool device_flagged = false;  // KeepReason::kNonFiniteOnDevice from the next step

  // Error-bounded mode: the mean square of the data (from the last measurement, 0: unknown),
  // the relative squared error allowed (infinite: no cap), where the cap came from
  // ("weight gradient" or "relative"), and the gradient-statistics version it was set from.
  double mean_square = 0.0;
  double error_cap = std::numeric_limits<double>::infinity();
  std::string cap_source;
  uint64_t cap_version = UINT64_MAX;
  int bound_candidate = -1;  // index into candidates of eb at the bound, -1: none yet

  // The rms error the cap allows (eb at the bound packs within it).
  double AllowedRms() const;
};

struct StepRecord {
  uint64_t index = 0;              // the step's number in the run, from 0
  uint64_t peak_bytes = 0;         // the allocator's allocated peak over the step (0: unknown)
  uint64_t peak_reserved_bytes = 0;  // its reserved peak: what a cap counts (0: unknown)
  // The peak as the operating system (resident set) or the CUDA driver counts it, above what
  // it was when the budget was entered (0: unknown).
  uint64_t system_peak_bytes = 0;
  uint64_t saved_raw_bytes = 0;    // what autograd would have kept without actpack
  uint64_t stored_bytes = 0;       // what actpack kept instead (packed + kept)
  uint64_t peak_live_stored = 0;   // peak of live packed bytes during the step
  uint64_t peak_live_raw = 0;      // the same tensors' raw bytes at that moment
  uint64_t automatic_bytes = 0;    // bytes held for the policy's tensors (stored or kept)
  bool profiled = false;           // candidates were measured in this step
};

// The policy's latest decision.
struct PolicyState {
  uint64_t plans = 0;              // times the policy planned
  uint64_t changed_plans = 0;      // plans that changed a tensor's codec
  uint64_t other_bytes = 0;        // modelled peak besides the policy's tensors
  uint64_t projected_peak = 0;
  bool feasible = true;
  uint64_t smallest_feasible_budget = 0;
  double weighted_error = 0.0;
  uint64_t pressure_events = 0;    // times the allocator ran out of budget mid-step
  uint64_t relieved_bytes = 0;     // raw bytes of kept tensors re-packed under pressure
  uint64_t capped_candidates = 0;  // candidates the error caps ruled out at the last plan
  // The fidelity floor in force (SessionOptions::max_rel_rms until a runaway gradient tightened
  // it: Session::TightenFloor) and how many times it was tightened.
  double max_rel_rms = 0.0;
  uint64_t floor_tightenings = 0;
  // Memory the system counts that the allocator does not hold (oneDNN's buffers, thread stacks,
  // the CUDA context): the most any step's system peak exceeded its allocator peak. The policy
  // plans for the budget less this (the allocator itself counts it as it reserves memory:
  // allocator::CountSystemMemory).
  uint64_t outside_pool_bytes = 0;
  // The allocator's reserved peak over its allocated peak on the last step that reported both:
  // whole segments, and blocks free but too small for the next request. The cap counts
  // reserved bytes while the policy models allocated ones, so it plans for the budget divided
  // by this (a ResNet-50 step on the CPU reserved 1.37x what it allocated).
  double fragmentation = 1.0;
};

// How many of a run's first steps, and of its last, the session keeps a StepRecord of (the
// report's "steps"): 88 bytes a step would otherwise grow without end over a long run.
inline constexpr size_t kStepsKept = 1024;

struct SessionTotals {
  uint64_t steps = 0;  // steps ended (Steps() keeps the first and the last kStepsKept of them)
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
  // Time inside the codecs (Encode in Pack, Decode in Unpack): what the hooks cost beyond it is
  // their overhead. On the CPU the host's clock around every call; on CUDA the device's, from
  // events around the calls of profile steps only (timing every call would cost the host more
  // than the codecs).
  uint64_t codec_nanoseconds = 0;
  // CUDA tensors: the reads of their statuses, each one wait for the device (one per step, one
  // more in a step whose eb tensors are unpacked before their sizes were seen).
  uint64_t device_status_reads = 0;
};

// Everything the session has recorded, copied at one moment: what the run report's
// "activations" section is written from (report/writer.h).
struct SessionState {
  SessionOptions options;
  SessionTotals totals;
  PolicyState policy;
  std::vector<SavedRecord> records;
  std::vector<StepRecord> steps;
  // Whether gradient statistics weigh the tensors (else every tensor weighs 1), and then each
  // record's weight, in the order of `records`.
  bool gradient_sensitivity = false;
  std::vector<double> sensitivity;
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

  // Gradient statistics per module (the plugin measures them at the end of a backward pass):
  // they weigh each tensor's error for the policy and, in the error-bounded mode, set the error
  // caps (gradient_statistics.h).
  void SetModuleGradients(const std::map<std::string, ModuleGradients>& gradients);

  // The gradients ran away under the policy's codecs (the plugin's gradient guard): the
  // fidelity floor halves (starts at kDefaultMaxRelRms where there was none) and every automatic
  // tensor whose codec it now rules out takes the harshest codec within it from the next pack
  // on; the next step's end plans again under it. Fixed codecs are the user's and stay. Returns
  // the new floor.
  double TightenFloor();

  // Memory pressure mid-step (the allocator is out of budget): the rest of the step packs the
  // policy's tensors with their harshest codec, and the policy plans again at the step's end.
  void StartRelief();

  // The plan that re-packs record `record`'s tensor, kept exact by the policy earlier in this
  // step, with its harshest codec to free memory under pressure (PackPlan::relief).
  PackPlan ReliefPlan(int record);

  // Measures plan.measure's candidates on a sample of `contiguous` (the saved tensor as the
  // plugin will pack it; nothing when plan.measure is empty). A host tensor is measured now and
  // ChooseMeasured applied to `plan`. A device tensor's sample is copied once, without waiting,
  // into pinned memory; it is measured after the step's one status read (EndStep, or an eb
  // unpack's), so its plan stands and the measurements apply from the next pack on.
  void MeasureCandidates(PackPlan& plan, const codecs::TensorView& contiguous,
                         const codecs::ExecContext& context);

  // What the plugin measured for candidate `index` of plan.measure.
  void RecordMeasurement(int record, size_t index, const CodecMeasurement& measurement);

  // After the plugin measured `plan`'s candidates: the safe default (the harshest candidate,
  // taken before the policy's first plan or under pressure) becomes the harshest one the
  // measurements allow, so that a tensor's first step already holds the fidelity floor (and a
  // profile of the step, as actpack.plan takes, packs as training will). Other plans stand.
  void ChooseMeasured(PackPlan& plan);

  // Closes the current step (a forward and its backward): records its totals and restarts the
  // ordinals. A step in which nothing was saved is not recorded. `peak_bytes` is the
  // allocator's allocated peak over the step (0 when unknown): the policy plans tensors'
  // bytes, and its headroom covers the allocator's fragmentation. With it the policy re-plans
  // after profile steps and whenever the peak came close to the budget. `reserved_bytes` (the
  // reserved peak, what a cap counts) is recorded for the report. `system_bytes` is the step's
  // peak as the system counts it (StepRecord::system_peak_bytes); what it exceeds the reserved
  // peak by is memory outside the allocator, which the budget must hold too (PolicyState::
  // outside_pool_bytes). kResourceExhausted when even the harshest plan cannot fit the budget,
  // naming the smallest budget that would.
  absl::Status EndStep(uint64_t peak_bytes = 0, uint64_t reserved_bytes = 0,
                       uint64_t system_bytes = 0);


  SessionTotals Totals() const;
  PolicyState Policy() const;
  std::vector<SavedRecord> Records() const;
  // The first kStepsKept steps and the last kStepsKept, in order (StepRecord::index numbers
  // them; Totals().steps counts every step).
  std::vector<StepRecord> Steps() const;

  // All of the above at one moment (for the report).
  SessionState State() const;

  // CUDA tensors: status slots held by packed tensors alive now (0 once they are all released).
  uint64_t LiveStatusSlots() const;

 private:
  // Dedup: this step's packed copies by where their data lies (storage, offset, version,
  // dtype), then by shape and strides (one entry, unless views of the same bytes differ): a
  // lookup copies nothing.
  using DedupKey = std::tuple<uintptr_t, int64_t, uint32_t, codecs::DType>;
  struct DedupEntry {
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    std::weak_ptr<PackedTensor> packed;
    // The entry of `info`'s view of the bytes, in `entries`; end() when there is none.
    static std::vector<DedupEntry>::iterator Find(std::vector<DedupEntry>& entries,
                                                  const SavedTensorInfo& info) {
      return std::find_if(entries.begin(), entries.end(), [&](const DedupEntry& e) {
        return e.shape == info.shape && e.strides == info.strides;
      });
    }
  };
  int RecordFor(const SavedTensorInfo& info, int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlanAutomatic(const SavedTensorInfo& info, SavedRecord& record, PackPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Replan(uint64_t peak_bytes, bool pool_full) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The budget less what the system holds outside the allocator: what the pool may reserve.
  std::vector<StepRecord> KeptStepsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t PoolBudget() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PoolBudget divided by the measured fragmentation: what the policy plans for.
  uint64_t PlanningBudget() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int HarshestCandidate(const SavedRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Allowed(const SavedRecord& record, int candidate) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateErrorBound(SavedRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlanBoundedEb(SavedRecord& record, PackPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRelease(const PackedTensor& packed);

  // CUDA tensors (codecs/deferred.h): packed and unpacked without waiting for the device.
  absl::StatusOr<std::shared_ptr<PackedTensor>> PackDeferred(const SavedTensorInfo& info,
                                                             const PackPlan& plan,
                                                             const codecs::TensorView& contiguous,
                                                             const codecs::ExecContext& context);
  absl::Status UnpackDeferred(const PackedTensor& packed, const codecs::MutableTensorView& output,
                              const codecs::ExecContext& context);
  // Whether this step is a profile step (the codecs' device time is measured on those).
  bool ProfilingNow() const;
  std::shared_ptr<PackedTensor> NewPacked(const SavedTensorInfo& info,
                                          std::unique_ptr<Buffer> buffer, size_t encoded_size,
                                          const codecs::ExecContext& context);
  // Counts a packed tensor in, and lets later saves of the same data reuse it.
  void Admit(const SavedTensorInfo& info, const PackPlan& plan, const codecs::CodecParams& params,
             const std::string& note, const std::shared_ptr<PackedTensor>& packed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A resolved encoding whose buffer is larger than it: shrunk with no lock held.
  struct Shrink {
    std::shared_ptr<PackedTensor> packed;
    size_t bytes = 0;
  };
  // A device tensor's sample in pinned memory, measured once its copy is known complete.
  struct PendingSample {
    int record = -1;
    std::vector<codecs::CodecParams> candidates;
    codecs::TensorView host;  // the staged sample
    uint64_t full_numel = 0;
    std::shared_ptr<DeviceStatusPool> pool;
    DeviceStatusPool::Sample staged;
  };
  // What the locked part of a call found to do once mu_ is released: shrinks and measurements
  // (they allocate, or call back into the session), and packed tensors whose last reference may
  // drop (their destructor takes mu_).
  // A resolved encoding the device put in the spill room: copied into a buffer of its size.
  struct Relocation {
    std::shared_ptr<PackedTensor> packed;
    codecs::Placement placement;
  };
  struct Deferred {
    std::vector<Shrink> shrinks;
    std::vector<Relocation> relocations;
    std::vector<PendingSample> samples;
    std::vector<std::shared_ptr<PackedTensor>> keep;
    std::vector<std::shared_ptr<SpillRoom>> spills;
  };
  // Completes an encoding whose size the device decided from its status read back; a buffer
  // larger than the encoding goes to `work` to shrink.
  void Resolve(const std::shared_ptr<PackedTensor>& packed, const codecs::DeviceStatus& read_back,
               Deferred* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves `device`'s encodings whose status has reached the host (never waits).
  void ResolveReady(int device, Deferred* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads every status of the step's CUDA packs and unpacks (one wait), resolves what is
  // left, flags records whose codec met values it cannot hold, hands the staged samples (now
  // complete) to `work`, and reports a corrupted buffer (kDataLoss naming the saved tensor and
  // its module).
  absl::Status CheckDeferred(Deferred* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Does what the locked part left in `work`; takes mu_ itself.
  void Finish(Deferred& work) ABSL_LOCKS_EXCLUDED(mu_);
  // The step's spill room for `context`'s device and stream, made on first use (an allocation:
  // no lock held).
  absl::StatusOr<std::shared_ptr<SpillRoom>> SpillRoomFor(const codecs::ExecContext& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The status pool of `context`'s device, made on first use.
  std::shared_ptr<DeviceStatusPool> StatusPoolFor(const codecs::ExecContext& context)
      ABSL_LOCKS_EXCLUDED(mu_);

  const SessionOptions options_;
  const BufferFactory factory_;
  std::shared_ptr<PackedTensor::Ledger> ledger_;

  mutable CheckedMutex mu_{"runtime::Session::mu_"};
  uint64_t pack_counter_ ABSL_GUARDED_BY(mu_) = 0;
  int ordinal_ ABSL_GUARDED_BY(mu_) = 0;
  // The largest tensor (parameters aside) saved so far this step: what an op's statistics are
  // small beside (see kStatisticsShare).
  uint64_t largest_saved_this_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<DedupKey, std::vector<DedupEntry>> dedup_ ABSL_GUARDED_BY(mu_);
  // The records of each ordinal (one, unless the step's tensors change from step to step): a
  // record is the same ordinal, producer and shape.
  std::vector<std::vector<int>> ordinal_records_ ABSL_GUARDED_BY(mu_);
  std::vector<SavedRecord> records_ ABSL_GUARDED_BY(mu_);
  // The first kStepsKept steps, then the last kStepsKept: a long run's history stays bounded.
  std::vector<StepRecord> first_steps_ ABSL_GUARDED_BY(mu_);
  std::deque<StepRecord> last_steps_ ABSL_GUARDED_BY(mu_);
  StepRecord current_step_ ABSL_GUARDED_BY(mu_);
  SessionTotals totals_ ABSL_GUARDED_BY(mu_);
  uint64_t step_index_ ABSL_GUARDED_BY(mu_) = 0;
  bool profiled_since_plan_ ABSL_GUARDED_BY(mu_) = false;
  bool relieving_this_step_ ABSL_GUARDED_BY(mu_) = false;
  GradientStatistics gradients_ ABSL_GUARDED_BY(mu_);
  std::vector<int> step_records_ ABSL_GUARDED_BY(mu_);  // records planned in this step
  PolicyState policy_ ABSL_GUARDED_BY(mu_);
  // CUDA tensors: statuses per device index, the step's deferred packs and unpacks for its
  // check, the encodings whose size the host has not seen, per device in encode order, and the
  // profile samples staged for measurement.
  struct DeferredUse {
    std::shared_ptr<DeviceStatusPool> pool;
    DeviceStatusPool::Slot slot;  // a decode's own, released once read
    int record;
    codecs::Header header;
    std::weak_ptr<PackedTensor> packed;  // a pack's (a decode's is empty)
    bool decode = false;
    std::string spec;  // a pack's codec, with its parameters
  };
  absl::flat_hash_map<int, std::shared_ptr<DeviceStatusPool>> status_pools_ ABSL_GUARDED_BY(mu_);
  std::vector<DeferredUse> deferred_this_step_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::deque<std::weak_ptr<PackedTensor>>> unresolved_
      ABSL_GUARDED_BY(mu_);
  std::vector<PendingSample> pending_samples_ ABSL_GUARDED_BY(mu_);
  // This step's spill rooms by device and stream, and the largest encoding whose size the
  // device decided so far (a spill room holds one such and an eighth).
  absl::flat_hash_map<std::pair<int, void*>, std::shared_ptr<SpillRoom>> spill_rooms_
      ABSL_GUARDED_BY(mu_);
  uint64_t largest_sized_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  friend class PackedTensor;
};

absl::string_view KeepReasonName(KeepReason reason);
// The report's code for a reason ("parameter", "below_min_bytes", ...; "" for kNone).
absl::string_view KeepReasonCode(KeepReason reason);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_SESSION_H_
