#include "torch_plugin/csrc/saved_tensors.h"

#include <ATen/Context.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/accumulate.h>
#include <ATen/ops/le.h>
#include <ATen/ops/logical_not.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>  // Node (torch 2.11 has no node.h)
#include <torch/csrc/autograd/generated/Functions.h>  // ReluBackward0
#include <torch/csrc/autograd/graph_task.h>
#ifdef ACTPACK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "torch_plugin/csrc/lean_backward.h"
#include "torch_plugin/csrc/tensor_adapter.h"
#include "torch_plugin/csrc/vector_loop.h"

namespace actpack::torch_plugin {

// A tensor the policy kept exact this step. Under memory pressure it is re-packed with the
// harshest codec and the tensor dropped (SavedTensorPacker::Relieve), which frees its memory
// when this was the only reference.
struct KeptTensor {
  at::Tensor tensor;  // undefined once re-packed
  std::shared_ptr<runtime::PackedTensor> packed;
  runtime::SavedTensorInfo info;
  int record = -1;
};

const runtime::PackedTensor* PackedHandle::Packed() const {
  return kept ? kept->packed.get() : packed.get();
}

uint64_t PackedHandle::RawBytes() const {
  return Packed() ? Packed()->raw_bytes() : kept->info.Bytes();
}

uint64_t PackedHandle::StoredBytes() const {
  return Packed() ? Packed()->stored_bytes() : kept->info.Bytes();
}

namespace {

// A packed tensor's bytes: a uint8 tensor from torch's allocator (actpack's pool when it is
// installed), allocated on `stream`, the stream its encode runs on.
class TensorBuffer final : public runtime::Buffer {
 public:
  TensorBuffer(at::Tensor bytes, void* stream) : bytes_(std::move(bytes)), stream_(stream) {}
  uint8_t* data() override { return bytes_.data_ptr<uint8_t>(); }
  size_t size() const override { return static_cast<size_t>(bytes_.numel()); }
  absl::Status ShrinkTo(size_t bytes) override {
    // Worth a copy only when it gives back a good share (variable-size codecs such as eb).
    if (bytes + bytes / 8 >= size()) return absl::OkStatus();
    try {
#ifdef ACTPACK_WITH_CUDA
      // On the buffer's own stream: the copy follows the encode that wrote it, and the smaller
      // buffer belongs to that stream as the larger did.
      std::optional<c10::cuda::CUDAStreamGuard> on_stream;
      if (bytes_.is_cuda()) {
        on_stream.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream_),
                                                           bytes_.get_device()));
      }
#endif
      bytes_ = bytes_.narrow(0, 0, static_cast<int64_t>(bytes)).clone();
    } catch (const c10::Error& error) {
      return absl::ResourceExhaustedError(error.what_without_backtrace());
    }
    return absl::OkStatus();
  }
  absl::Status RecordStream(void* stream) override {
#ifdef ACTPACK_WITH_CUDA
    if (bytes_.is_cuda()) {
      bytes_.record_stream(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                            bytes_.get_device()));
    }
#endif
    return absl::OkStatus();
  }
  const at::Tensor& tensor() const { return bytes_; }

 private:
  at::Tensor bytes_;
  void* const stream_;
};

runtime::BufferFactory TorchBufferFactory() {
  return [](size_t bytes, const codecs::ExecContext& context)
             -> absl::StatusOr<std::unique_ptr<runtime::Buffer>> {
    try {
#ifdef ACTPACK_WITH_CUDA
      // Allocated on the stream the session names (the buffer's stream from then on), which
      // is not always the current one (an encoding moved out of the spill room at a step's end).
      std::optional<c10::cuda::CUDAStreamGuard> on_stream;
      if (context.device == codecs::Device::kCuda) {
        on_stream.emplace(c10::cuda::getStreamFromExternal(
            static_cast<cudaStream_t>(context.stream),
            static_cast<c10::DeviceIndex>(context.device_index)));
      }
#endif
      at::Tensor storage = Empty({static_cast<int64_t>(bytes)}, BufferOptions(context));
      return std::unique_ptr<runtime::Buffer>(new TensorBuffer(std::move(storage), context.stream));
    } catch (const c10::OutOfMemoryError& error) {
      return absl::ResourceExhaustedError(error.what_without_backtrace());
    }
  };
}

// How `tensor` lies in memory (`layout`) and the sizes and strides of its stored view (see
// Stored), computed from its own sizes and strides: describing a saved tensor makes no view.
// Broadcast dims are narrowed to one element, then the dims are permuted to memory order.
void StoredLayout(const at::Tensor& tensor, Layout& layout, std::vector<int64_t>& sizes,
                  std::vector<int64_t>& strides) {
  const at::IntArrayRef tensor_sizes = tensor.sizes();
  const at::IntArrayRef tensor_strides = tensor.strides();
  sizes.assign(tensor_sizes.begin(), tensor_sizes.end());
  strides.assign(tensor_strides.begin(), tensor_strides.end());
  if (tensor.is_contiguous()) return;
  const size_t dims = sizes.size();
  for (size_t d = 0; d < dims; ++d) {
    if (strides[d] == 0 && sizes[d] > 1) {
      sizes[d] = 1;
      layout.sizes = tensor_sizes.vec();
    }
  }
  // Dims of size 1 have no place in memory: they keep theirs, the others are sorted by stride.
  std::vector<int64_t> order(dims);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> spread;
  for (int64_t d : order) {
    if (sizes[d] > 1) spread.push_back(d);
  }
  std::vector<int64_t> sorted = spread;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  for (size_t i = 0; i < spread.size(); ++i) order[spread[i]] = sorted[i];
  if (!std::is_sorted(order.begin(), order.end())) {
    const std::vector<int64_t> unordered_sizes = sizes, unordered_strides = strides;
    for (size_t i = 0; i < dims; ++i) {
      sizes[i] = unordered_sizes[order[i]];
      strides[i] = unordered_strides[order[i]];
    }
    layout.order = std::move(order);
  }
  // Dense in memory order, or skipping memory: the stored view's strides against its own
  // contiguous ones (dims of size 1 have any stride).
  int64_t expected = 1;
  for (size_t i = dims; i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) {
      layout.strides = tensor_strides.vec();
      break;
    }
    expected *= sizes[i];
  }
}

// `tensor` as stored, as StoredLayout described it: a view, contiguous unless `tensor` skips
// memory (a slice).
at::Tensor Stored(const at::Tensor& tensor, const Layout& layout) {
  at::Tensor stored = tensor;
  if (!layout.sizes.empty()) {
    for (int64_t d = 0; d < tensor.dim(); ++d) {
      if (tensor.stride(d) == 0 && tensor.size(d) > 1) stored = stored.narrow(d, 0, 1);
    }
  }
  if (!layout.order.empty()) stored = stored.permute(layout.order);
  return stored;
}

// The inverse of Stored: a view of `stored` with the saved tensor's sizes and stride order.
at::Tensor Restore(const at::Tensor& stored, const Layout& layout) {
  at::Tensor tensor = stored;
  if (!layout.order.empty()) {
    std::vector<int64_t> inverse(layout.order.size());
    for (size_t i = 0; i < layout.order.size(); ++i) inverse[layout.order[i]] = static_cast<int64_t>(i);
    tensor = tensor.permute(inverse);
  }
  if (!layout.sizes.empty()) tensor = tensor.expand(layout.sizes);
  return tensor;
}

// The bool tensor a sign mask is encoded from or decoded into (`saved <= 0`), alive while this
// lives. A host one lives outside torch's allocator: a quarter of the tensor's bytes for a
// moment, which in the budget's pool split segments (a 14 MiB budget then failed a 1 MiB request
// with 5.4 MiB cached in pieces). Up to kKeptBytes it is one buffer per thread, kept: one
// malloc'd per tensor was mapped by glibc and faulted in afresh each time (16,000 page faults a
// step on the suite's ResNet-50 under `auto`, 7,000 of them from masks up to 1 MiB). Not larger:
// a kept buffer counts outside the pool at every reservation, where a transient one counted
// only while it lived; kept up to 16 MiB it cost the planner's CNN under 256 MiB 4 samples of
// its 134 (tools/budget_check.py plan --model cnn --budget 256MiB --codec auto).
class SignScratch {
 public:
  static constexpr size_t kKeptBytes = size_t{1} << 20;

  SignScratch() = default;
  SignScratch(const SignScratch&) = delete;
  SignScratch& operator=(const SignScratch&) = delete;
  ~SignScratch() {
    if (held_ != nullptr) held_->in_use = false;
  }

  at::Tensor Bools(at::IntArrayRef shape, const at::TensorOptions& options) {
    if (!options.device().is_cpu()) return Empty(shape, options.dtype(at::kBool));
    const size_t bytes = std::max<int64_t>(1, c10::multiply_integers(shape));
    thread_local Buffer kept;
    uint8_t* data = nullptr;
    if (kept.in_use || bytes > kKeptBytes) {  // in use further up this thread's stack, or too big
      own_.reset(new uint8_t[bytes]);
      data = own_.get();
    } else {
      if (kept.size < bytes) {
        kept.data.reset();  // the old one goes first: never both
        kept.data.reset(new uint8_t[bytes]);
        kept.size = bytes;
      }
      kept.in_use = true;
      held_ = &kept;
      data = kept.data.get();
    }
    return at::from_blob(data, shape, options.dtype(at::kBool));
  }

 private:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
    bool in_use = false;
  };
  Buffer* held_ = nullptr;
  std::unique_ptr<uint8_t[]> own_;
};

// `bools = values <= 0` and `values = !bools` (0 or 1 in the values' dtype): a sign mask's way in
// and out. torch's comparison and logical_not into another dtype run a scalar loop per element
// (1.0 and 1.65 ms for a 12 MiB float32 tensor on 2 cores, a copy 0.43 ms); ResNet-50's masks
// took 30 ms of its CPU step that way. Float32 on the host gets loops the compiler vectorizes
// (for AVX2 where the CPU has it); NaN compares false, as in le.
constexpr int64_t kSignGrain = int64_t{1} << 16;

bool HostFloat32Pair(const at::Tensor& values, const at::Tensor& bools) {
  return values.is_cpu() && values.scalar_type() == at::kFloat && values.is_contiguous() &&
         bools.is_contiguous();
}

ACTPACK_VECTOR_LOOP void SignBytes(const float* __restrict in, int64_t n,
                                    uint8_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] <= 0.0f;
}

ACTPACK_VECTOR_LOOP void ValuesOfSignBytes(const uint8_t* __restrict in, int64_t n,
                                           float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i] ^ 1);
}

void SignMaskOf(const at::Tensor& values, at::Tensor& bools) {
  if (!HostFloat32Pair(values, bools)) {
    at::le_out(bools, values, 0);
    return;
  }
  const float* in = values.const_data_ptr<float>();
  auto* out = reinterpret_cast<uint8_t*>(bools.mutable_data_ptr<bool>());
  at::parallel_for(0, values.numel(), kSignGrain, [=](int64_t begin, int64_t end) {
    SignBytes(in + begin, end - begin, out + begin);
  });
}

void ValuesOfSignMask(const at::Tensor& bools, at::Tensor& values) {
  if (!HostFloat32Pair(values, bools)) {
    at::logical_not_out(values, bools);
    return;
  }
  const auto* in = reinterpret_cast<const uint8_t*>(bools.const_data_ptr<bool>());
  float* out = values.mutable_data_ptr<float>();
  at::parallel_for(0, values.numel(), kSignGrain, [=](int64_t begin, int64_t end) {
    ValuesOfSignBytes(in + begin, end - begin, out + begin);
  });
}

// Whether `node`, the tensor's producer, is a ReLU saving it now: its one saved variable is
// still unset while the save runs (the pack hook runs before it is assigned), set once saved.
// A later reader of the same tensor (the next convolution) sees it set. A ReLU whose save no
// hooks of actpack's saw (a checkpointed region's) left it set as well.
bool IsReluSavingItsOutput(torch::autograd::Node* node) {
  if (node->name() != "ReluBackward0") return false;
  const auto* relu = dynamic_cast<const torch::autograd::generated::ReluBackward0*>(node);
  if (relu == nullptr || relu->result_.has_hooks()) return false;
  const std::optional<at::Tensor> data = relu->result_.get_raw_data();
  return !(data.has_value() && data->defined());
}

// Set around the saving of a region's inputs (SetSavingRegionInputs).
thread_local runtime::RegionInput saving_region_inputs = runtime::RegionInput::kNone;

// `tensor` as autograd saved it, described as stored (StoredLayout fills `layout`): shape,
// strides and bytes are those of what is kept. The storage guard is left to GuardStorage: only
// what is packed needs one.
runtime::SavedTensorInfo Describe(const at::Tensor& tensor, Layout& layout) {
  runtime::SavedTensorInfo info;
  const std::optional<codecs::DType> dtype = ToCodecDType(tensor.scalar_type());
  info.supported_dtype = dtype.has_value() && (tensor.is_cpu() || tensor.is_cuda());
  info.dtype = dtype.value_or(codecs::DType::kUInt8);
  StoredLayout(tensor, layout, info.shape, info.strides);
  info.device = tensor.is_cuda() ? codecs::Device::kCuda : codecs::Device::kCpu;
  info.device_index = tensor.is_cuda() ? tensor.get_device() : 0;
  // A parameter lives anyway, and so does a view of one (linear layers save weight.t()):
  // packing either would add a copy, not save one. Other leaves (tensors that do not require
  // grad) are usually intermediates that die after forward, so they are packed.
  const auto is_parameter = [](const at::TensorBase& t) { return t.is_leaf() && t.requires_grad(); };
  info.is_parameter =
      is_parameter(tensor) || (tensor.is_view() && is_parameter(tensor._base()));
  if (tensor.has_storage()) {
    // The storage object, not the data pointer, which the allocator hands out again once the
    // data is freed (see GuardStorage).
    info.storage = reinterpret_cast<uintptr_t>(tensor.storage().unsafeGetStorageImpl());
    info.storage_offset = tensor.storage_offset();
  }
  info.version = static_cast<uint32_t>(tensor._version());
  info.is_view = tensor.is_view();
  info.in_backward = torch::autograd::get_current_graph_task_id() != -1;
  info.region_input = saving_region_inputs;
  if (const auto node = tensor.grad_fn()) {
    info.producer = node->name();
    info.sign_only = IsReluSavingItsOutput(node.get());
  } else {
    info.producer = tensor.is_leaf() ? "leaf" : "";
  }
  return info;
}

// Holds `tensor`'s storage object weakly in `info`: its address (info.storage, the dedup key)
// cannot be reused while the guard lives, that is while a packed copy of it exists.
void GuardStorage(const at::Tensor& tensor, runtime::SavedTensorInfo& info) {
  if (info.storage_guard != nullptr || !tensor.has_storage()) return;
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  info.storage_guard = std::make_shared<c10::weak_intrusive_ptr<c10::StorageImpl>>(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
}

// A device guard for CUDA tensors; host tensors need none.
std::optional<c10::Device> GuardedDevice(const at::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  return device;
}

// Whether a decoded activation goes back channels_last: a 4-D NCHW tensor on the CPU, read by
// the backward of a convolution or of what sits between convolutions (batch norm, activations,
// pooling). oneDNN runs a convolution's backward on NCHW operands through blocked copies of the
// input, the output gradient and the input gradient (measured: 3x the input's bytes beyond it
// for a 1x1 convolution, 6x with a wide output) and on channels_last ones in their own layout
// (1.05-1.14x), and faster. The gradients these ops produce follow their inputs' layout, so
// once convolutions read channels_last the gradients between them are channels_last too, and
// the activations read beside them must be as well: torch's kernels for mixed layouts copy or
// take slow paths (batch norm's backward: 6x slower). The decoded tensor is fresh memory
// either way. Measured on a ResNet-50 step (quant2, batch 64, 64x64): the peak's bytes beyond
// parameters, gradients and optimizer state 1.76 -> 1.38 MiB a sample, the step no slower
// (1.05 s against 1.11 s). Only with oneDNN on (torch's own convolution would copy back),
// while a backward node runs (get_current_node names it), and for lossy codecs: `identity`
// stays what parity runs need, plain training bit for bit.
bool WantsChannelsLast(const runtime::PackedTensor& packed, const at::Tensor& decoded) {
  if (packed.codec() == codecs::CodecId::kIdentity || !decoded.is_cpu() || decoded.dim() != 4 ||
      !decoded.is_contiguous() || decoded.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      !at::globalContext().userEnabledMkldnn() || !at::hasMKLDNN()) {
    return false;
  }
  // A shared_ptr up to torch 2.11 (the GPU machine), an intrusive_ptr in later releases.
  const auto node = torch::autograd::get_current_node();
  if (!node) return false;
  static const absl::flat_hash_set<std::string>* const kConvNetBackward =
      new absl::flat_hash_set<std::string>{
          "ConvolutionBackward0", "NativeBatchNormBackward0", "ReluBackward0",
          "HardtanhBackward0", "LeakyReluBackward0", "SiluBackward0", "HardswishBackward0",
          "MaxPool2DWithIndicesBackward0", "AvgPool2DBackward0"};
  return kConvNetBackward->contains(node->name());
}

// Whether the backward running is a torch.compile'd graph's (AOTAutograd's compiled function):
// its generated code checks each saved tensor's sizes and strides (assert_size_stride), where
// eager kernels take any layout.
bool InCompiledBackward() {
  const auto node = torch::autograd::get_current_node();
  return node && node->name() == "CompiledFunctionBackward";
}

// `dense` copied into a tensor with `strides` (those of the saved tensor, which skipped memory):
// its storage spans the gaps, which are left unwritten. Only for compiled graphs: the span of a
// slice of a fused tensor is a multiple of the slice (q of a fused qkv: 3x).
at::Tensor RestoreStrides(const at::Tensor& dense, const std::vector<int64_t>& strides) {
  at::Tensor exact = at::empty_strided(dense.sizes(), strides, dense.options());
  exact.copy_(dense);
  return exact;
}

}  // namespace

runtime::RegionInput SetSavingRegionInputs(runtime::RegionInput kind) {
  return std::exchange(saving_region_inputs, kind);
}

void StepEndWatch::Packed() {
  if (torch::autograd::get_current_graph_task_id() == -1) queued_.store(false);
}

bool StepEndWatch::QueueEndNow() {
  return !c10::GradMode::is_enabled() && torch::autograd::get_current_graph_task_id() != -1 &&
         !queued_.exchange(true);
}

SavedTensorPacker::SavedTensorPacker(const runtime::BudgetConfig& config,
                                       uint64_t budget_bytes,
                                       uint64_t outside_allowance_bytes) {
  ThrowIfError(config.Validate());
  absl::StatusOr<runtime::SessionOptions> options =
      config.SessionOptionsFor(budget_bytes, outside_allowance_bytes);
  ThrowIfError(options.status());
  session_ = std::make_unique<runtime::Session>(*std::move(options), TorchBufferFactory());
  RegisterLeanBackwardKernels();
}

SavedTensor SavedTensorPacker::Pack(const at::Tensor& tensor, std::string module) {
  const c10::OptionalDeviceGuard device_guard(GuardedDevice(tensor.device()));
  PackedHandle handle;
  handle.options = tensor.options();
  runtime::SavedTensorInfo info = Describe(tensor, handle.layout);
  info.module = std::move(module);
  runtime::PackPlan plan = session_->Plan(info);
  if (plan.action == runtime::PackAction::kReuse) {
    handle.packed = std::move(plan.duplicate);
    return handle;
  }
  if (plan.action == runtime::PackAction::kKeep && plan.measure.empty()) {
    return Keep(tensor, info, plan, std::move(handle));
  }
  // The data as stored, contiguous: the tensor itself when it is (the codecs only read its
  // memory; measuring runs torch ops on it, so they get it detached), a copy only for a
  // tensor that skips memory (a slice), which dies once encoded.
  const at::Tensor contiguous =
      tensor.is_contiguous()
          ? (plan.measure.empty() ? tensor : tensor.detach())
          : Stored(tensor.detach(), handle.layout).contiguous();
  // Measured on the host now, or on a GPU from a sample staged for the step's status read.
  if (!plan.measure.empty()) {
    session_->MeasureCandidates(plan, ToView(contiguous), ContextFor(contiguous));
  }
  if (plan.action == runtime::PackAction::kKeep) {
    return Keep(tensor, info, plan, std::move(handle));
  }
  GuardStorage(tensor, info);
  // What the reader of a sign mask reads (see PackPlan::sign_mask), alive until encoded.
  SignScratch scratch;
  at::Tensor encoded = contiguous;
  if (plan.sign_mask) {
    encoded = scratch.Bools(contiguous.sizes(), contiguous.options());
    SignMaskOf(contiguous, encoded);
  }
  absl::StatusOr<std::shared_ptr<runtime::PackedTensor>> packed =
      session_->Pack(info, plan, ToView(encoded), ContextFor(encoded));
  ThrowIfError(packed.status());
  handle.packed = std::move(*packed);
  return handle;
}

// A kept tensor as autograd saves it: itself, or, when the policy chose to keep it exact, a
// handle that Relieve can re-pack under memory pressure. Detached: a saved output that held
// its own autograd node would close a cycle (node -> saved object -> tensor -> node) through
// C++, which Python's collector cannot see; a step that raised before its backward would then
// keep its whole graph alive for good.
SavedTensor SavedTensorPacker::Keep(const at::Tensor& tensor,
                                     const runtime::SavedTensorInfo& info,
                                     const runtime::PackPlan& plan, PackedHandle handle) {
  at::Tensor detached = tensor.detach();
  if (plan.reason != runtime::KeepReason::kFitsBudget) return detached;
  handle.kept =
      std::make_shared<KeptTensor>(KeptTensor{std::move(detached), nullptr, info, plan.record});
  GuardStorage(tensor, handle.kept->info);  // Relieve may pack it
  kept_.push_back(handle.kept);
  return handle;
}

at::Tensor SavedTensorPacker::Unpack(const SavedTensor& saved) {
  if (const at::Tensor* tensor = std::get_if<at::Tensor>(&saved)) return *tensor;
  const PackedHandle& h = std::get<PackedHandle>(saved);
  if (h.kept && h.kept->tensor.defined()) return h.kept->tensor;
  const runtime::PackedTensor& packed = *h.Packed();
  const c10::OptionalDeviceGuard device_guard(GuardedDevice(h.options.device()));
  at::Tensor output = Empty(packed.shape(), h.options);
  if (packed.sign_mask()) {
    // `saved <= 0`, back as the values threshold_backward reads the same way: 0 and 1. Only
    // ReLU's backward may read them.
    const auto node = torch::autograd::get_current_node();
    TORCH_CHECK(node && node->name() == "ReluBackward0",
                "actpack: this ReLU output was saved as the mask its backward reads "
                "(output <= 0), not its values; it was read by ",
                node ? node->name() : std::string("code outside a backward pass"),
                ". Keep the ReLU's module exact (codec={'<relu module>': 'none'}) to read it "
                "elsewhere");
    SignScratch scratch;
    at::Tensor zeroed = scratch.Bools(packed.shape(), h.options);
    ThrowIfError(session_->Unpack(packed, ToMutableView(zeroed), ContextFor(zeroed)));
    ValuesOfSignMask(zeroed, output);
  } else {
    ThrowIfError(session_->Unpack(packed, ToMutableView(output), ContextFor(output)));
  }
  at::Tensor restored = Restore(output, h.layout);
  if (!h.layout.strides.empty() && InCompiledBackward()) {
    restored = RestoreStrides(restored, h.layout.strides);
  } else if (WantsChannelsLast(packed, restored)) {
    restored = ToChannelsLastInPlace(restored);
  }
  // Fresh memory only this node reads: its op may write its result there (lean_backward.h).
  // Not for `identity`, whose decoded tensors must give plain training's gradients bit for bit.
  if (packed.codec() != codecs::CodecId::kIdentity) OfferAsScratch(restored);
  return restored;
}

void SavedTensorPacker::SetModuleGradients(
    const std::map<std::string, std::tuple<double, double, double, double>>& gradients) {
  std::map<std::string, runtime::ModuleGradients> converted;
  for (const auto& [module, g] : gradients) {
    converted[module] = {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g)};
  }
  session_->SetModuleGradients(converted);
}

// Only a tensor whose memory nothing else holds frees anything; a non-contiguous one would
// need a contiguous copy first, so it stays.
size_t SavedTensorPacker::Relieve(size_t needed) {
  session_->StartRelief();
  std::vector<std::shared_ptr<KeptTensor>> candidates;
  std::vector<std::weak_ptr<KeptTensor>> live;
  for (const std::weak_ptr<KeptTensor>& weak : kept_) {
    std::shared_ptr<KeptTensor> kept = weak.lock();
    if (kept == nullptr) continue;
    live.push_back(weak);
    const at::Tensor& t = kept->tensor;
    if (t.defined() && t.is_contiguous() &&
        t.storage().use_count() == 1 && t.storage().nbytes() == t.nbytes()) {
      candidates.push_back(std::move(kept));
    }
  }
  kept_ = std::move(live);
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return a->tensor.nbytes() > b->tensor.nbytes();
  });
  size_t freed = 0;
  for (const std::shared_ptr<KeptTensor>& kept : candidates) {
    if (freed >= needed) break;
    const runtime::PackPlan plan = session_->ReliefPlan(kept->record);
    if (plan.action != runtime::PackAction::kPack) continue;
    const c10::OptionalDeviceGuard device_guard(kept->tensor.device());
    absl::StatusOr<std::shared_ptr<runtime::PackedTensor>> packed;
    try {
      packed = session_->Pack(kept->info, plan, ToView(kept->tensor), ContextFor(kept->tensor));
    } catch (const c10::Error&) {
      continue;  // no room even for the encoded copy
    }
    if (!packed.ok()) continue;
    kept->packed = std::move(*packed);
    freed += kept->tensor.nbytes();
#ifdef ACTPACK_WITH_CUDA
    // The encode reads it on this thread's current stream; its memory must not go back to its
    // own stream's reuse before that read has run.
    if (kept->tensor.is_cuda()) {
      kept->tensor.record_stream(at::cuda::getCurrentCUDAStream(kept->tensor.get_device()));
    }
#endif
    kept->tensor = at::Tensor();
  }
  return freed;
}


}  // namespace actpack::torch_plugin
