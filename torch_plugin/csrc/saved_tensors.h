// The torch layer of the saved-tensor session, without Python: what a pack hook does with the
// tensor autograd saves and what an unpack hook gives back, over the runtime layer's
// runtime::Session (records, policy, packed bytes).
//
// Two front ends share it: actpack._C.SavedTensorHooks (saved_tensor_hooks_bindings.h, the
// Python layer), behind the Python context actpack.budget, and the C++ guard actpack::Budget
// (budget.h), behind LibTorch's saved-variable hooks. Buffers are torch uint8 tensors on the
// saved tensor's device, so their bytes come from (and are counted by) the same allocator as
// every other tensor of the step.
//
//   SavedTensorPacker packer(config, budget_bytes, outside_allowance_bytes);
//   SavedTensor saved = packer.Pack(tensor, "layer1.conv");  // in the pack hook
//   at::Tensor back = packer.Unpack(saved);                   // in the unpack hook
//   budget_run.EndStep();  // when the backward pass ends (runtime::BudgetRun, over
//                          // packer.session())
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_SAVED_TENSORS_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_SAVED_TENSORS_H_

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/budget_config.h"
#include "runtime/json.h"
#include "runtime/session.h"

namespace actpack::torch_plugin {

// How a saved tensor lies over its memory. A tensor is packed as it is stored: dimensions in
// memory order (a transpose or a channels_last activation is dense, so packing copies nothing)
// and broadcast dimensions (stride 0, from expand) once; unpack puts the strides back.
struct Layout {
  std::vector<int64_t> order;  // stored dim i is the saved tensor's dim order[i]; empty: same
  std::vector<int64_t> sizes;  // the saved tensor's sizes, when broadcast dims were dropped
  // The saved tensor's strides when it skips memory (a slice, such as q of a fused qkv): what
  // a compiled graph's backward checks its saved tensors against (see Unpack).
  std::vector<int64_t> strides;
};

struct KeptTensor;

// What pack hands to autograd for a packed (or policy-kept) tensor.
struct PackedHandle {
  std::shared_ptr<runtime::PackedTensor> packed;
  std::shared_ptr<KeptTensor> kept;  // instead of `packed`, for a policy-exact tensor
  at::TensorOptions options;         // dtype and device of the original
  Layout layout;

  const runtime::PackedTensor* Packed() const;
  uint64_t RawBytes() const;
  uint64_t StoredBytes() const;
};

// A saved tensor as autograd holds it: the tensor itself (kept as it is), or a handle.
using SavedTensor = std::variant<at::Tensor, PackedHandle>;

// Whose region's inputs the saves this thread makes now are (runtime::RegionInput): the Python
// front end sets it around torch.utils.checkpoint's saving of them (actpack/_checkpoint.py) and
// around actpack.recompute's (actpack/_recompute.py). Returns the previous value.
runtime::RegionInput SetSavingRegionInputs(runtime::RegionInput kind);

// When a training step ends, for both front ends: at the end of the first backward pass that
// unpacks saved tensors (the engine runs queued callbacks once all of its work is done). A
// backward with create_graph=True (grad mode on) builds a graph that a later backward
// differentiates: the step goes on until that one. A backward that raised never ran its queued
// end: the next pack outside a backward forgets it.
//
//   watch.Packed();                                    // in the pack hook
//   if (watch.QueueEndNow()) engine.queue_callback(end_step);  // in the unpack hook
//   watch.Ended();                                     // first thing in end_step
class StepEndWatch {
 public:
  void Packed();
  // True once per step, in the backward pass that ends it: the caller queues the step's end.
  bool QueueEndNow();
  void Ended() { queued_.store(false); }

 private:
  std::atomic<bool> queued_{false};
};

class SavedTensorPacker {
 public:
  // A session for `config` with a budget of `budget_bytes` on the saved tensors' device and
  // `outside_allowance_bytes` the system may count outside the pool. Throws ValueError
  // (c10::ValueError) naming a bad option (runtime::BudgetConfig::Validate).
  SavedTensorPacker(const runtime::BudgetConfig& config, uint64_t budget_bytes,
                     uint64_t outside_allowance_bytes);

  // `tensor` is being saved for backward inside module `module` ("" when unknown).
  SavedTensor Pack(const at::Tensor& tensor, std::string module);
  at::Tensor Unpack(const SavedTensor& saved);

  // {module: (Σ‖g‖² of its parameters, ‖g_W‖² of its weight, ‖g_y‖² of its output, fan)}.
  void SetModuleGradients(
      const std::map<std::string, std::tuple<double, double, double, double>>& gradients);

  // The allocator's pressure callback: the rest of the step packs harsh, and tensors the policy
  // kept exact are re-packed with their harshest codec, largest first, until `needed` bytes are
  // freed. Returns the bytes freed.
  size_t Relieve(size_t needed);

  // The runtime session under the tensors: a budget run ends its steps (runtime::BudgetRun).
  runtime::Session& session() { return *session_; }
  runtime::PolicyState Policy() const { return session_->Policy(); }
  runtime::SessionTotals Totals() const { return session_->Totals(); }
  runtime::SessionState State() const { return session_->State(); }

 private:
  SavedTensor Keep(const at::Tensor& tensor, const runtime::SavedTensorInfo& info,
                   const runtime::PackPlan& plan, PackedHandle handle);

  std::unique_ptr<runtime::Session> session_;
  // Tensors the policy kept exact, for Relieve (pruned as they expire).
  std::vector<std::weak_ptr<KeptTensor>> kept_;
};

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_SAVED_TENSORS_H_
