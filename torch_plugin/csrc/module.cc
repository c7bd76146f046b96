// The Python module actpack._C and the torch ops actpack::encode / actpack::decode.
//
// Session wraps runtime::Session for saved_tensors_hooks: pack() returns the tensor itself when
// it is kept, or an opaque PackedTensor; unpack() turns either back into a tensor. Buffers are
// torch uint8 tensors on the saved tensor's device, so their bytes come from (and are counted
// by) the same allocator as every other tensor of the step.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/graph_task.h>
#ifdef ACTPACK_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <map>
#include <cmath>
#include <tuple>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "allocator/units.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "runtime/config.h"
#include "runtime/json.h"
#include "runtime/session.h"
#include "torch_plugin/csrc/allocator_bindings.h"
#include "torch_plugin/csrc/cli_bindings.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;

class TensorBuffer final : public runtime::Buffer {
 public:
  explicit TensorBuffer(at::Tensor bytes) : bytes_(std::move(bytes)) {}
  uint8_t* data() override { return bytes_.data_ptr<uint8_t>(); }
  size_t size() const override { return static_cast<size_t>(bytes_.numel()); }
  absl::Status ShrinkTo(size_t bytes) override {
    // Worth a copy only when it gives back a good share (variable-size codecs such as eb).
    if (bytes + bytes / 8 < size()) bytes_ = bytes_.narrow(0, 0, static_cast<int64_t>(bytes)).clone();
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
};

at::TensorOptions BufferOptions(const codecs::ExecContext& context) {
  at::TensorOptions options = at::TensorOptions().dtype(at::kByte);
  if (context.device == codecs::Device::kCuda) {
    return options.device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(context.device_index)));
  }
  return options.device(at::kCPU);
}

runtime::BufferFactory TorchBufferFactory() {
  return [](size_t bytes, const codecs::ExecContext& context)
             -> absl::StatusOr<std::unique_ptr<runtime::Buffer>> {
    at::Tensor storage = at::empty({static_cast<int64_t>(bytes)}, BufferOptions(context));
    return std::unique_ptr<runtime::Buffer>(new TensorBuffer(std::move(storage)));
  };
}

// How a saved tensor lies over its memory. A tensor is packed as it is stored: dimensions in
// memory order (a transpose or a channels_last activation is dense, so packing copies nothing)
// and broadcast dimensions (stride 0, from expand) once; unpack puts the strides back.
struct Layout {
  std::vector<int64_t> order;  // stored dim i is the saved tensor's dim order[i]; empty: same
  std::vector<int64_t> sizes;  // the saved tensor's sizes, when broadcast dims were dropped
};

// `tensor` as stored: broadcast dims narrowed to one element, then permuted to memory order.
// The result is a view; it is contiguous unless `tensor` skips memory (a slice).
at::Tensor Stored(const at::Tensor& tensor, Layout& layout) {
  if (tensor.is_contiguous()) return tensor;
  at::Tensor stored = tensor;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.stride(d) == 0 && tensor.size(d) > 1) {
      stored = stored.narrow(d, 0, 1);
      layout.sizes = tensor.sizes().vec();
    }
  }
  // Dims of size 1 have no place in memory: they keep theirs, the others are sorted by stride.
  std::vector<int64_t> order(static_cast<size_t>(tensor.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> spread;
  for (int64_t d : order) {
    if (stored.size(d) > 1) spread.push_back(d);
  }
  std::vector<int64_t> sorted = spread;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int64_t a, int64_t b) { return stored.stride(a) > stored.stride(b); });
  for (size_t i = 0; i < spread.size(); ++i) order[spread[i]] = sorted[i];
  if (!std::is_sorted(order.begin(), order.end())) {
    stored = stored.permute(order);
    layout.order = std::move(order);
  }
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

// A tensor the policy kept exact this step. Under memory pressure it is re-packed with the
// harshest codec and the tensor dropped (PySession::Relieve), which frees its memory when this
// was the only reference.
struct KeptTensor {
  at::Tensor tensor;  // undefined once re-packed
  std::shared_ptr<runtime::PackedTensor> packed;
  runtime::SavedTensorInfo info;
  int record = -1;
};

// What pack() hands to autograd for a packed (or policy-kept) tensor.
struct PackedHandle {
  std::shared_ptr<runtime::PackedTensor> packed;
  std::shared_ptr<KeptTensor> kept;  // instead of `packed`, for a policy-exact tensor
  at::TensorOptions options;  // dtype and device of the original
  const runtime::PackedTensor* Packed() const { return kept ? kept->packed.get() : packed.get(); }
  Layout layout;
};

// Profile steps measure each candidate codec on a sample of the saved tensor: whole samples
// (slices along dim 0) up to this many elements, at least one sample.
constexpr int64_t kMeasureElements = 1 << 18;

// Measures `params` on a sample of `contiguous`. Host tensors are measured in host memory
// outside torch's allocator (runtime::MeasureOnHost), so profiling does not raise the peak it
// profiles; device tensors with torch ops on the device (a few sample-sized temporaries).
runtime::CodecMeasurement Measure(const at::Tensor& contiguous, const codecs::CodecParams& params) {
  at::Tensor sample = contiguous;
  if (contiguous.dim() > 0 && contiguous.numel() > kMeasureElements && contiguous.size(0) > 1) {
    const int64_t per_row = contiguous.numel() / contiguous.size(0);
    sample = contiguous.narrow(0, 0, std::max<int64_t>(1, kMeasureElements / per_row));
  }
  const uint64_t full_numel = static_cast<uint64_t>(contiguous.numel());
  if (sample.is_cpu()) return runtime::MeasureOnHost(ToView(sample), full_numel, params);

  runtime::CodecMeasurement m;
  const codecs::TensorView view = ToView(sample);
  const codecs::ExecContext context = ContextFor(sample);
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(view.Spec(), params);
  absl::StatusOr<size_t> bound = codecs::MaxEncodedSize(ToView(contiguous).Spec(), params);
  if (!capacity.ok() || !bound.ok()) {
    m.exact = true;
    return m;
  }
  at::Tensor buffer = at::empty({static_cast<int64_t>(*capacity)}, BufferOptions(context));
  absl::StatusOr<size_t> used =
      codecs::Encode(view, params, buffer.data_ptr<uint8_t>(), *capacity, context);
  if (!used.ok()) {
    m.exact = true;  // the session keeps such a tensor exact (non-finite values)
    return m;
  }
  at::Tensor decoded = at::empty_like(sample);
  ThrowIfError(codecs::Decode(buffer.data_ptr<uint8_t>(), *used, ToMutableView(decoded), context));
  if (at::isFloatingType(sample.scalar_type())) {
    const at::Tensor x = sample.to(at::kFloat);
    const at::Tensor error = decoded.to(at::kFloat).sub_(x);
    m.squared_error = error.square().sum(at::kDouble).item<double>();
    m.squared_norm = x.square().sum(at::kDouble).item<double>();
    m.max_abs_error = sample.numel() > 0 ? error.abs().max().item<double>() : 0.0;
  }
  m.count = static_cast<uint64_t>(sample.numel());
  m.bytes = runtime::ScaleEncodedSize(*used, m.count, full_numel, *bound);
  return m;
}

// `tensor` as autograd saved it, described by `stored` (its Stored view): shape, strides and
// bytes are those of what is kept.
runtime::SavedTensorInfo Describe(const at::Tensor& tensor, const at::Tensor& stored) {
  runtime::SavedTensorInfo info;
  const std::optional<codecs::DType> dtype = ToCodecDType(tensor.scalar_type());
  info.supported_dtype = dtype.has_value() && (tensor.is_cpu() || tensor.is_cuda());
  info.dtype = dtype.value_or(codecs::DType::kUInt8);
  info.shape = stored.sizes().vec();
  info.strides = stored.strides().vec();
  info.device = tensor.is_cuda() ? codecs::Device::kCuda : codecs::Device::kCpu;
  info.device_index = tensor.is_cuda() ? tensor.get_device() : 0;
  // A parameter lives anyway, and so does a view of one (linear layers save weight.t()):
  // packing either would add a copy, not save one. Other leaves (tensors that do not require
  // grad) are usually intermediates that die after forward, so they are packed.
  const auto is_parameter = [](const at::TensorBase& t) { return t.is_leaf() && t.requires_grad(); };
  info.is_parameter =
      is_parameter(tensor) || (tensor.is_view() && is_parameter(tensor._base()));
  if (tensor.has_storage()) {
    // The storage object, held weakly: its address cannot be reused while the guard lives,
    // unlike the data pointer, which the allocator hands out again once the data is freed.
    c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    info.storage = reinterpret_cast<uintptr_t>(storage);
    info.storage_guard = std::make_shared<c10::weak_intrusive_ptr<c10::StorageImpl>>(
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
    info.storage_offset = tensor.storage_offset();
  }
  info.version = static_cast<uint32_t>(tensor._version());
  info.in_backward = torch::autograd::get_current_graph_task_id() != -1;
  if (const auto node = tensor.grad_fn()) {
    info.producer = node->name();
  } else {
    info.producer = tensor.is_leaf() ? "leaf" : "";
  }
  return info;
}

class PySession {
 public:
  // `codec` is "auto" or a codec spec; `rules` maps module-name globs to either.
  PySession(const std::string& codec, const std::vector<std::pair<std::string, std::string>>& rules,
            int64_t min_bytes, uint64_t seed, bool enabled, int64_t budget_bytes, double headroom,
            int64_t profile_every, const std::vector<std::string>& ladder,
            double allowed_loss_increase) {
    runtime::SessionOptions options;
    options.codec = ChoiceOrThrow(codec);
    for (const auto& [pattern, spec] : rules) {
      options.rules.push_back({pattern, ChoiceOrThrow(spec)});
    }
    TORCH_CHECK_VALUE(min_bytes >= 0, "actpack: min_bytes must be >= 0, got ", min_bytes);
    TORCH_CHECK_VALUE(budget_bytes >= 0, "actpack: the budget must be >= 0 bytes, got ", budget_bytes);
    TORCH_CHECK_VALUE(headroom >= 0.0 && headroom < 0.5, "actpack: headroom must be in [0, 0.5), got ",
                      headroom);
    TORCH_CHECK_VALUE(profile_every >= 1, "actpack: profile_every must be >= 1 step, got ",
                      profile_every);
    options.min_bytes = static_cast<uint64_t>(min_bytes);
    options.seed = seed;
    options.enabled = enabled;
    options.budget_bytes = static_cast<uint64_t>(budget_bytes);
    options.headroom = headroom;
    options.profile_every = static_cast<int>(std::min<int64_t>(profile_every, 1 << 30));
    TORCH_CHECK_VALUE(std::isfinite(allowed_loss_increase) && allowed_loss_increase >= 0.0 &&
                          allowed_loss_increase < 1.0,
                      "actpack: allowed_loss_increase must be a fraction in (0, 1) (0: off), got ",
                      allowed_loss_increase);
    options.allowed_loss_increase = allowed_loss_increase;
    if (!ladder.empty()) {
      options.ladder.clear();
      for (const std::string& spec : ladder) {
        absl::StatusOr<codecs::CodecParams> params = codecs::ParseCodecSpec(spec);
        ThrowIfError(params.status());
        options.ladder.push_back(*params);
      }
    }
    session_ = std::make_unique<runtime::Session>(options, TorchBufferFactory());
  }

  py::object Pack(const at::Tensor& tensor, const std::string& module) {
    const c10::OptionalDeviceGuard device_guard(tensor.device());
    PackedHandle handle;
    handle.options = tensor.options();
    const at::Tensor stored = Stored(tensor.detach(), handle.layout);
    runtime::SavedTensorInfo info = Describe(tensor, stored);
    info.module = module;
    runtime::PackPlan plan = session_->Plan(info);
    if (plan.action == runtime::PackAction::kReuse) {
      handle.packed = std::move(plan.duplicate);
      return py::cast(std::move(handle));
    }
    if (plan.action == runtime::PackAction::kKeep && plan.measure.empty()) {
      return Keep(tensor, info, plan, std::move(handle));
    }
    // A copy only for a tensor that skips memory (a slice); it dies once encoded.
    const at::Tensor contiguous = stored.contiguous();
    for (size_t i = 0; i < plan.measure.size(); ++i) {
      session_->RecordMeasurement(plan.record, i, Measure(contiguous, plan.measure[i]));
    }
    if (plan.action == runtime::PackAction::kKeep) {
      return Keep(tensor, info, plan, std::move(handle));
    }
    absl::StatusOr<std::shared_ptr<runtime::PackedTensor>> packed =
        session_->Pack(info, plan, ToView(contiguous), ContextFor(contiguous));
    ThrowIfError(packed.status());
    handle.packed = std::move(*packed);
    return py::cast(std::move(handle));
  }

  // A kept tensor as autograd saves it: itself, or, when the policy chose to keep it exact, a
  // handle that Relieve can re-pack under memory pressure.
  py::object Keep(const at::Tensor& tensor, const runtime::SavedTensorInfo& info,
                  const runtime::PackPlan& plan, PackedHandle handle) {
    if (plan.reason != runtime::KeepReason::kPolicyExact) return py::cast(tensor);
    handle.kept = std::make_shared<KeptTensor>(KeptTensor{tensor, nullptr, info, plan.record});
    kept_.push_back(handle.kept);
    return py::cast(std::move(handle));
  }

  at::Tensor Unpack(const py::object& handle) {
    if (THPVariable_Check(handle.ptr())) return THPVariable_Unpack(handle.ptr());
    const PackedHandle& h = handle.cast<const PackedHandle&>();
    if (h.kept && h.kept->tensor.defined()) return h.kept->tensor;
    const runtime::PackedTensor& packed = *h.Packed();
    const c10::OptionalDeviceGuard device_guard(h.options.device());
    at::Tensor output = at::empty(packed.shape(), h.options);
    ThrowIfError(session_->Unpack(packed, ToMutableView(output), ContextFor(output)));
    return Restore(output, h.layout);
  }

  // {module: (Σ‖g‖² of its parameters, ‖g_W‖² of its weight, ‖g_y‖² of its output, fan)}.
  void SetModuleGradients(
      const std::map<std::string, std::tuple<double, double, double, double>>& gradients) {
    std::map<std::string, runtime::ModuleGradients> converted;
    for (const auto& [module, g] : gradients) {
      converted[module] = {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g)};
    }
    session_->SetModuleGradients(converted);
  }

  // The allocator's pressure callback: the rest of the step packs harsh, and tensors the policy
  // kept exact are re-packed with their harshest codec, largest first, until `needed` bytes are
  // freed. Only a tensor whose memory nothing else holds frees anything; a non-contiguous one
  // would need a contiguous copy first, so it stays. Returns the bytes freed.
  size_t Relieve(size_t needed) {
    session_->OnPressure();
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
        packed = session_->Pack(kept->info, plan, ToView(kept->tensor),
                                ContextFor(kept->tensor));
      } catch (const c10::Error&) {
        continue;  // no room even for the encoded copy
      }
      if (!packed.ok()) continue;
      kept->packed = std::move(*packed);
      freed += kept->tensor.nbytes();
      kept->tensor = at::Tensor();
    }
    return freed;
  }

  // The allocator's allocated and reserved peaks over the step, 0 when unknown (see
  // Session::EndStep). Raises torch.OutOfMemoryError when even the harshest plan cannot fit.
  void EndStep(uint64_t peak_bytes, uint64_t reserved_bytes) {
    ThrowIfError(session_->EndStep(peak_bytes, reserved_bytes));
  }

  py::dict Policy() const {
    const runtime::PolicyState p = session_->Policy();
    py::dict d;
    d["plans"] = p.plans;
    d["other_bytes"] = p.other_bytes;
    d["projected_peak_bytes"] = p.projected_peak;
    d["feasible"] = p.feasible;
    d["smallest_feasible_budget"] = p.smallest_feasible_budget;
    return d;
  }

  std::string ActivationReport() const {
    return json::Serialize(session_->ActivationReport(), 0);
  }

  py::dict Totals() const {
    const runtime::SessionTotals t = session_->Totals();
    py::dict d;
    d["packed_raw_bytes"] = t.packed_raw_bytes;
    d["packed_stored_bytes"] = t.packed_stored_bytes;
    d["kept_bytes"] = t.kept_bytes;
    d["reused_bytes"] = t.reused_bytes;
    d["packs"] = t.packs;
    d["unpacks"] = t.unpacks;
    d["exact_fallbacks"] = t.exact_fallbacks;
    d["live_stored_bytes"] = t.live_stored;
    d["peak_live_stored_bytes"] = t.peak_live_stored;
    d["live_raw_bytes"] = t.live_raw;
    d["peak_live_raw_bytes"] = t.peak_live_raw;
    d["codec_seconds"] = static_cast<double>(t.codec_nanoseconds) * 1e-9;
    return d;
  }

 private:
  // Tensors the policy kept exact, for Relieve (pruned as they expire).
  std::vector<std::weak_ptr<KeptTensor>> kept_;
  static runtime::CodecChoice ChoiceOrThrow(const std::string& text) {
    absl::StatusOr<runtime::CodecChoice> choice = runtime::ParseCodecChoice(text);
    ThrowIfError(choice.status());
    return *choice;
  }

  std::unique_ptr<runtime::Session> session_;
};

// The CPU codecs' parallel loops on torch's intra-op pool (at::parallel_for, as many threads as
// torch.set_num_threads), so that a step never runs more threads than torch itself would.
class TorchExecutor final : public codecs::CpuExecutor {
 public:
  int Threads() const override { return at::get_num_threads(); }
  void Run(int tasks, const std::function<void(int)>& body) const override {
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) body(static_cast<int>(t));
    });
  }
};

// ---- torch ops: one schema, one implementation for every device (the codecs dispatch) ----

at::Tensor EncodeOp(const at::Tensor& input, c10::string_view codec, int64_t seed) {
  absl::StatusOr<codecs::CodecParams> params =
      codecs::ParseCodecSpec(absl::string_view(codec.data(), codec.size()));
  ThrowIfError(params.status());
  params->seed = static_cast<uint64_t>(seed);
  TORCH_CHECK_TYPE(ToCodecDType(input.scalar_type()).has_value(), "actpack: unsupported dtype ",
                   input.scalar_type(), "; expected a float, integer or bool tensor");
  const c10::OptionalDeviceGuard device_guard(input.device());
  const at::Tensor contiguous = input.detach().contiguous();
  const codecs::TensorView view = ToView(contiguous);
  const codecs::ExecContext context = ContextFor(contiguous);
  absl::StatusOr<size_t> capacity = codecs::MaxEncodedSize(view.Spec(), *params);
  ThrowIfError(capacity.status());
  at::Tensor buffer = at::empty({static_cast<int64_t>(*capacity)}, BufferOptions(context));
  absl::StatusOr<size_t> used =
      codecs::Encode(view, *params, buffer.data_ptr<uint8_t>(), *capacity, context);
  ThrowIfError(used.status());
  return buffer.narrow(0, 0, static_cast<int64_t>(*used));
}

at::Tensor DecodeOp(const at::Tensor& buffer) {
  TORCH_CHECK_VALUE(buffer.scalar_type() == at::kByte && buffer.dim() == 1,
                    "actpack: decode expects a 1-D uint8 buffer from actpack.encode, got a ",
                    buffer.dim(), "-D ", buffer.scalar_type(), " tensor");
  const c10::OptionalDeviceGuard device_guard(buffer.device());
  // Payloads are read as 32-bit words: a slice starting mid-word is copied to fresh memory.
  const at::Tensor contiguous = buffer.contiguous();
  const at::Tensor bytes = reinterpret_cast<uintptr_t>(contiguous.data_ptr()) % 4 == 0
                               ? contiguous
                               : contiguous.clone();
  const codecs::ExecContext context = ContextFor(bytes);
  // Verify before allocating: a corrupt shape is then kDataLoss, not a huge allocation.
  absl::StatusOr<codecs::Header> header =
      codecs::Verify(bytes.data_ptr<uint8_t>(), bytes.numel(), context);
  ThrowIfError(header.status());
  at::Tensor output =
      at::empty(header->Shape(), bytes.options().dtype(ToTorchDType(header->dtype)));
  ThrowIfError(
      codecs::DecodeVerified(*header, bytes.data_ptr<uint8_t>(), ToMutableView(output), context));
  return output;
}

std::string ParseBudgetToJson(const std::string& text) {
  absl::StatusOr<runtime::Budget> budget = runtime::ParseBudget(text);
  ThrowIfError(budget.status());
  json::Value v = json::Value::Object();
  v.Set("bytes", budget->bytes);
  v.Set("fraction", budget->fraction);
  v.Set("text", budget->ToString());
  return json::Serialize(v, 0);
}

// The run report: the runtime's activation section under the caller's run metadata.
std::string BuildReport(const std::string& run_json, const PySession& session) {
  absl::StatusOr<json::Value> run = json::Parse(run_json);
  ThrowIfError(run.status());
  absl::StatusOr<json::Value> activations = json::Parse(session.ActivationReport());
  ThrowIfError(activations.status());
  json::Value report = json::Value::Object();
  report.Set("schema", "actpack.report");
  report.Set("schema_version", 1);
  report.Set("run", std::move(*run));
  report.Set("activations", std::move(*activations));
  return json::Serialize(report, 2);
}

}  // namespace
}  // namespace actpack::torch_plugin

using actpack::torch_plugin::DecodeOp;
using actpack::torch_plugin::EncodeOp;
using actpack::torch_plugin::PackedHandle;
using actpack::torch_plugin::PySession;
namespace py = pybind11;

TORCH_LIBRARY(actpack, m) {
  m.def("encode(Tensor input, str codec, int seed=0) -> Tensor");
  m.def("decode(Tensor buffer) -> Tensor");
}

TORCH_LIBRARY_IMPL(actpack, CPU, m) {
  m.impl("encode", &EncodeOp);
  m.impl("decode", &DecodeOp);
}

#ifdef ACTPACK_WITH_CUDA
TORCH_LIBRARY_IMPL(actpack, CUDA, m) {
  m.impl("encode", &EncodeOp);
  m.impl("decode", &DecodeOp);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "actpack's C++ runtime: codecs, the saved-tensor session and the report";
  static const actpack::torch_plugin::TorchExecutor torch_executor;
  actpack::codecs::SetCpuExecutor(&torch_executor);
  actpack::torch_plugin::BindCli(m);
#ifdef ACTPACK_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  py::class_<PackedHandle>(m, "PackedTensor")
      .def_property_readonly("raw_bytes",
                             [](const PackedHandle& h) {
                               return h.Packed() ? h.Packed()->raw_bytes() : h.kept->info.Bytes();
                             })
      .def_property_readonly("stored_bytes", [](const PackedHandle& h) {
        return h.Packed() ? h.Packed()->stored_bytes() : h.kept->info.Bytes();
      });
  py::class_<PySession>(m, "Session")
      .def(py::init<const std::string&, const std::vector<std::pair<std::string, std::string>>&,
                    int64_t, uint64_t, bool, int64_t, double, int64_t,
                    const std::vector<std::string>&, double>(),
           py::arg("codec"), py::arg("rules") = std::vector<std::pair<std::string, std::string>>{},
           py::arg("min_bytes") = 64 * 1024, py::arg("seed") = 0, py::arg("enabled") = true,
           py::arg("budget_bytes") = 0, py::arg("headroom") = 0.05, py::arg("profile_every") = 50,
           py::arg("ladder") = std::vector<std::string>{},
           py::arg("allowed_loss_increase") = 0.0)
      .def("pack", &PySession::Pack, py::arg("tensor"), py::arg("module") = "")
      .def("unpack", &PySession::Unpack)
      .def("relieve", &PySession::Relieve, py::arg("needed"))
      .def("set_module_gradients", &PySession::SetModuleGradients, py::arg("gradients"))
      .def("end_step", &PySession::EndStep, py::arg("peak_bytes") = 0,
           py::arg("reserved_bytes") = 0)
      .def("policy", &PySession::Policy)
      .def("totals", &PySession::Totals)
      .def("activation_report", &PySession::ActivationReport);
  m.def("build_report", &actpack::torch_plugin::BuildReport, py::arg("run_json"), py::arg("session"));
  m.def("parse_budget", &actpack::torch_plugin::ParseBudgetToJson, py::arg("text"));
  m.def("parse_size", [](const std::string& text) {
    absl::StatusOr<uint64_t> bytes = actpack::runtime::ParseByteSize(text);
    actpack::torch_plugin::ThrowIfError(bytes.status());
    return *bytes;
  });
  m.def("parse_key_values", [](const std::string& text, const std::vector<std::string>& allowed,
                               const std::string& source) {
    auto pairs = actpack::runtime::ParseKeyValues(text, allowed, source);
    actpack::torch_plugin::ThrowIfError(pairs.status());
    return *pairs;
  });
  m.def("format_bytes", [](uint64_t bytes) { return actpack::allocator::FormatBytes(bytes); });
  m.def("codec_names", [] {
    std::vector<std::string> names;
    for (const actpack::codecs::Codec* codec : actpack::codecs::AllCodecs()) {
      names.emplace_back(codec->name());
    }
    return names;
  });
  actpack::torch_plugin::BindAllocator(m);
}
