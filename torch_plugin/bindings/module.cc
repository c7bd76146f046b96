// The Python module actpack._C and the torch ops actpack::encode / actpack::decode.
//
// SavedTensorHooks (saved_tensor_hooks_bindings.h) is saved_tensors.h's SavedTensorPacker for
// Python's saved_tensors_hooks.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/device_allocator.h"
#include "allocator/units.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "common/version.h"
#include "runtime/codec_choice.h"
#include "runtime/config.h"
#include "report/writer.h"
#include "runtime/json.h"
#include "runtime/policy.h"
#include "runtime/session.h"
#include "torch_plugin/bindings/allocator_bindings.h"
#include "torch_plugin/bindings/cli_bindings.h"
#include "torch_plugin/csrc/kernel_image.h"
#include "torch_plugin/csrc/lean_backward.h"
#include "torch_plugin/bindings/python_json.h"
#include "torch_plugin/bindings/saved_tensor_hooks_bindings.h"
#include "torch_plugin/csrc/saved_tensors.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;

// The CPU codecs' parallel loops on torch's intra-op pool (at::parallel_for, as many threads as
// torch.set_num_threads), so that a step never runs more threads than torch itself would. With
// torch's OpenMP backend at::parallel_for is parallel only where this file is compiled with
// OpenMP (setup.py's -fopenmp); without it, it runs every task on the calling thread.
class TorchExecutor final : public codecs::CpuExecutor {
 public:
  int Threads() const override { return at::get_num_threads(); }
  // Tasks are claimed as threads come free, as in the built-in pool, not split evenly up
  // front: a thread whose core another process slows down then runs fewer of them.
  void Run(int tasks, const std::function<void(int)>& body) const override {
    std::atomic<int> next{0};
    at::parallel_for(0, std::min(tasks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
      for (int t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) body(t);
    });
  }
};

const TorchExecutor torch_executor;

// How many threads torch's pool runs the codecs' tasks on (the OpenMP team's size; 1 when the
// tasks run on the calling thread alone): the tests check that the codecs use the pool.
int ExecutorTeamSize() {
  std::atomic<int> team{1};
  torch_executor.Run(torch_executor.Threads(), [&](int) {
#ifdef _OPENMP
    int size = omp_get_num_threads();
    for (int seen = team.load(); size > seen && !team.compare_exchange_weak(seen, size);) {
    }
#endif
  });
  return team.load();
}

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

py::dict ParseBudgetToDict(const std::string& text) {
  absl::StatusOr<runtime::MemoryLimit> budget = runtime::ParseMemoryLimit(text);
  ThrowIfError(budget.status());
  py::dict parsed;
  parsed["bytes"] = budget->bytes;
  parsed["fraction"] = budget->fraction;
  parsed["text"] = budget->ToString();
  return parsed;
}

// Validates a run report and writes it to `path` (ValueError naming the problem otherwise).
void WriteReport(py::handle document, const std::string& path) {
  const json::Value value = FromPython(document);
  absl::Status written;
  {
    py::gil_scoped_release release;
    written = report::WriteRunReport(value, path);
  }
  if (!written.ok()) throw py::value_error(absl::StrCat("actpack: ", written.message()));
}

}  // namespace
}  // namespace actpack::torch_plugin

using actpack::torch_plugin::DecodeOp;
using actpack::torch_plugin::EncodeOp;
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
  actpack::codecs::SetCpuExecutor(&actpack::torch_plugin::torch_executor);
  m.def("_executor_team_size", &actpack::torch_plugin::ExecutorTeamSize);
  m.def("_set_lean_backward", &actpack::torch_plugin::SetLeanBackward, py::arg("enabled"));
  m.def("_lean_backward_taken", &actpack::torch_plugin::LeanBackwardTaken);
  actpack::torch_plugin::BindCli(m);
#ifdef ACTPACK_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  // The architectures the CUDA kernels were built for ("sm_80 sm_90 compute_90"; "" without
  // CUDA), the check a device's first CUDA use runs, and its message (kernel_image.h).
  m.attr("cuda_architectures") = actpack::torch_plugin::CudaArchitecturesBuilt();
  m.def("_check_kernel_image", &actpack::torch_plugin::CheckKernelImage, py::arg("device"));
  m.def("_no_kernel_image_message", &actpack::torch_plugin::NoKernelImageMessage,
        py::arg("device"), py::arg("name"), py::arg("major"), py::arg("minor"), py::arg("built"),
        py::arg("ptx_too_new") = false);
  // The session's defaults, defined once in runtime/session.h.
  m.attr("DEFAULT_HEADROOM") = actpack::runtime::kDefaultHeadroom;
  m.attr("DEFAULT_PROFILE_EVERY") = actpack::runtime::kDefaultProfileEvery;
  m.attr("DEFAULT_MIN_BYTES") = actpack::runtime::kDefaultMinBytes;
  m.attr("DEFAULT_MAX_REL_RMS") = actpack::runtime::kDefaultMaxRelRms;
  m.def("is_profile_step", &actpack::runtime::IsProfileStep, py::arg("step"),
        py::arg("profile_every"));
  // "checkpoint", "recompute" or "none": whose region's inputs this thread saves now.
  m.def(
      "_saving_region_inputs",
      [](const std::string& kind) {
        using actpack::runtime::RegionInput;
        static const std::map<std::string, RegionInput> kinds = {
            {"none", RegionInput::kNone},
            {"checkpoint", RegionInput::kCheckpoint},
            {"recompute", RegionInput::kRecompute}};
        const auto it = kinds.find(kind);
        if (it == kinds.end()) {
          throw py::value_error("actpack._C._saving_region_inputs: \"none\", \"checkpoint\" "
                                "or \"recompute\", got \"" + kind + "\"");
        }
        const RegionInput previous = actpack::torch_plugin::SetSavingRegionInputs(it->second);
        for (const auto& [name, value] : kinds) {
          if (value == previous) return name;
        }
        return std::string("none");
      },
      py::arg("kind"));
  actpack::torch_plugin::BindSavedTensorHooks(m);
  m.def("write_report", &actpack::torch_plugin::WriteReport, py::arg("report"), py::arg("path"));
  m.def(
      "allocator_section",
      [](const std::string& backend, bool actpack, uint64_t budget_bytes, py::handle stats,
         std::optional<uint64_t> peak_allocated, std::optional<uint64_t> peak_reserved,
         py::handle snapshot) {
        using actpack::torch_plugin::FromPython;
        return actpack::torch_plugin::ToPython(actpack::report::AllocatorSection(
            {backend, actpack, budget_bytes, FromPython(stats), peak_allocated, peak_reserved,
             FromPython(snapshot)}));
      },
      py::arg("backend"), py::arg("actpack"), py::arg("budget_bytes"), py::arg("stats"),
      py::arg("peak_allocated_bytes"), py::arg("peak_reserved_bytes"), py::arg("snapshot"));
  m.attr("__version__") = actpack::kVersion;
  m.def("parse_budget", &actpack::torch_plugin::ParseBudgetToDict, py::arg("text"));
  m.def(
      "resolve_budget",
      [](uint64_t bytes, double fraction, int device) {
        // A share of the device is taken of allocator::DeviceTotalBytes.
        const actpack::runtime::MemoryLimit budget{bytes, fraction};
        if (bytes != 0) return budget.Resolve(0);
        absl::StatusOr<size_t> total = actpack::allocator::DeviceTotalBytes(device);
        actpack::torch_plugin::ThrowIfError(total.status());
        return budget.Resolve(*total);
      },
      py::arg("bytes"), py::arg("fraction"), py::arg("device"));
  m.attr("MAX_SIZE_BYTES") = actpack::runtime::kMaxSizeBytes;
  m.attr("NOT_PACKED") = std::string(actpack::runtime::kNotPacked);
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
  // A codec spec as the registry writes it back (its options in full); ValueError naming what is
  // wrong otherwise.
  m.def("canonical_codec_spec", [](const std::string& spec) {
    absl::StatusOr<actpack::codecs::CodecParams> params = actpack::codecs::ParseCodecSpec(spec);
    actpack::torch_plugin::ThrowIfError(params.status());
    return actpack::codecs::FormatCodecSpec(*params);
  });
  m.def("codec_names", [] {
    std::vector<std::string> names;
    for (const actpack::codecs::Codec* codec : actpack::codecs::AllCodecs()) {
      names.emplace_back(codec->name());
    }
    return names;
  });
  // The codecs actpack.plan compares by default besides none and auto: each one's harshest
  // spec that codec="auto" may choose.
  m.def("plan_codecs", [] { return actpack::runtime::SessionOptions::HarshestPerCodec(); });
  actpack::torch_plugin::BindAllocator(m);
}
