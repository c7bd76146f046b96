// actpack::Budget in LibTorch C++ training loops on the CPU: the hooks really pack (identity is
// bitwise plain training, other codecs store fewer bytes), a budget holds every step after the
// first plan with the loss close to plain training, the report matches the Python context's,
// module scopes and rules apply, bad options fail before training, and the scenarios the
// Python context runs too (torch_plugin/testdata/budget_scenarios.json) hold here alike.
#include "torch_plugin/csrc/budget.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/json.h"
#include "torch_plugin/csrc/cpu_allocator.h"
#include "torch_plugin/csrc/lean_backward.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack {
namespace {

using torch_plugin::ToChannelsLastInPlace;

using ::testing::HasSubstr;

struct Net : torch::nn::Module {
  explicit Net(int64_t width) {
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(32, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, width));
    fc3 = register_module("fc3", torch::nn::Linear(width, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h;
    {
      ModuleScope scope("encoder");
      h = torch::tanh(fc1(x));
      h = torch::tanh(fc2(h));
    }
    ModuleScope scope("head");
    return fc3(torch::relu(h));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct Training {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
};

// `steps` Adam steps on a learnable task (labels from a fixed random linear teacher); under a
// budget with `options` unless `options` is null. The budget's report lands in `report`.
Training Train(const BudgetOptions* options, int steps, int64_t width, int64_t batch,
               json::Value* report = nullptr) {
  Net net(width);
  torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(3e-3));
  torch::manual_seed(1);
  const torch::Tensor teacher = torch::randn({32, 10});
  Training result;
  auto loop = [&] {
    for (int i = 0; i < steps; ++i) {
      const torch::Tensor x = torch::randn({batch, 32});
      const torch::Tensor y = torch::matmul(x, teacher).argmax(1);
      const torch::Tensor loss = torch::nn::functional::cross_entropy(net.forward(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      result.losses.push_back(loss.item<double>());
    }
  };
  if (options != nullptr) {
    Budget budget(*options);
    loop();
    budget.Close();
    if (report != nullptr) *report = budget.report();
  } else {
    loop();
  }
  for (const torch::Tensor& p : net.parameters()) result.params.push_back(p.detach().clone());
  return result;
}

double MeanOfLast(const std::vector<double>& values, size_t n) {
  double sum = 0;
  for (size_t i = values.size() - n; i < values.size(); ++i) sum += values[i];
  return sum / static_cast<double>(n);
}

const json::Value& Get(const json::Value& object, const std::string& key) {
  const json::Value* value = json::Find(object, key);
  EXPECT_NE(value, nullptr) << "no member " << key;
  static const json::Value null;
  return value != nullptr ? *value : null;
}

TEST(BudgetTest, IdentityPacksEverySavedTensorAndTrainsBitwiseLikePlain) {
  const Training plain = Train(nullptr, 5, 64, 32);
  BudgetOptions options;
  options.limit = "1GiB";
  options.codec = "identity";
  options.min_bytes = "0";
  json::Value report;
  const Training packed = Train(&options, 5, 64, 32, &report);
  EXPECT_EQ(packed.losses, plain.losses);
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(packed.params[i], plain.params[i])) << "parameter " << i;
  }
  const json::Value& activations = Get(report, "activations");
  // The hooks ran: activations were encoded and decoded, one step per backward.
  EXPECT_GT(Get(Get(activations, "totals"), "packs").get<int64_t>(), 5 * 3);
  EXPECT_EQ(Get(activations, "steps").size(), 5u);
}

// One backward of a small conv net (batch norm, in-place ReLU, a 1x1 convolution) under a
// quant8 budget, with or without the lean backward kernels: the gradients, and how many
// decoded activations the kernels wrote over.
std::vector<torch::Tensor> ConvNetGradients(bool lean, int64_t* taken) {
  namespace nn = torch::nn;
  torch::manual_seed(0);
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)),
                     nn::BatchNorm2d(16), nn::ReLU(nn::ReLUOptions(true)),
                     nn::Conv2d(nn::Conv2dOptions(16, 32, 1).bias(false)), nn::BatchNorm2d(32),
                     nn::ReLU(nn::ReLUOptions(true)));
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({8, 3, 16, 16});
  torch_plugin::SetLeanBackward(lean);
  const int64_t before = torch_plugin::LeanBackwardTaken();
  BudgetOptions options;
  options.limit = "1GiB";
  options.codec = "quant8";
  options.min_bytes = "0";
  {
    Budget budget(options);
    net->forward(x).square().mean().backward();
    budget.Close();
  }
  torch_plugin::SetLeanBackward(true);
  *taken = torch_plugin::LeanBackwardTaken() - before;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : net->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

// Decoded activations go channels_last in their own memory (saved_tensors.cc): the same values
// as torch's copy, for every element width, odd tile edges, one channel or one pixel, and a
// tensor that shares its storage (copied, never overwritten).
TEST(ToChannelsLastInPlaceTest, MatchesTorchsChannelsLastCopy) {
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 5, 7, 9}, {2, 64, 33, 31}, {4, 3, 32, 32}, {2, 1, 5, 5}, {2, 8, 1, 1}, {0, 4, 2, 2}};
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kByte}) {
    for (const std::vector<int64_t>& shape : shapes) {
      const at::Tensor source = torch::arange(
          c10::multiply_integers(shape), torch::TensorOptions().dtype(torch::kLong))
          .remainder(251).to(dtype).reshape(shape);
      const at::Tensor expected = source.contiguous(at::MemoryFormat::ChannelsLast);
      at::Tensor t = source.clone();
      const void* const data = t.data_ptr();
      const at::Tensor result = ToChannelsLastInPlace(t);
      EXPECT_EQ(result.data_ptr(), data) << "in place";
      EXPECT_TRUE(result.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_TRUE(torch::equal(result, expected)) << dtype << " " << source.sizes();
    }
  }
  const at::Tensor whole = torch::randn({2, 4, 6, 6});
  const at::Tensor view = whole.narrow(0, 1, 1);  // shares the storage with sample 0
  const at::Tensor copy = ToChannelsLastInPlace(view);
  EXPECT_NE(copy.data_ptr(), view.data_ptr());
  EXPECT_TRUE(torch::equal(copy, view));
  EXPECT_TRUE(view.is_contiguous());
}

// LibTorch's autograd nodes take the offers as Python's do: both batch norms, the first ReLU
// (the last one's gradient comes from square() NCHW, its decoded output channels_last) and,
// with oneDNN, the 1x1 convolution; the gradients are ATen's to float rounding (as in
// tests/test_lean_backward.py: measured at most 4.4e-6 of a gradient's norm).
TEST(BudgetTest, LeanBackwardKernelsRunForLibTorchNodesWithAtensGradients) {
  int64_t aten_taken = 0, lean_taken = 0;
  const std::vector<torch::Tensor> aten = ConvNetGradients(false, &aten_taken);
  const std::vector<torch::Tensor> lean = ConvNetGradients(true, &lean_taken);
  EXPECT_EQ(aten_taken, 0);
  EXPECT_EQ(lean_taken, at::hasMKLDNN() ? 4 : 3);
  ASSERT_EQ(aten.size(), lean.size());
  for (size_t i = 0; i < aten.size(); ++i) {
    EXPECT_LE((aten[i] - lean[i]).norm().item<double>(), 1e-5 * aten[i].norm().item<double>())
        << "parameter " << i;
  }
}

TEST(BudgetTest, AutoKeepsEveryStepUnderTheBudgetWithTheLossOfPlainTraining) {
  constexpr int kSteps = 30;
  // Activations dominate the step: 4 MiB per saved hidden layer, 256 KiB of weights.
  constexpr int64_t kWidth = 256, kBatch = 4096;
  BudgetOptions measure;
  measure.limit = "4GiB";
  measure.enabled = false;
  json::Value plain_report;
  const Training plain = Train(&measure, kSteps, kWidth, kBatch, &plain_report);
  const int64_t plain_peak = Get(Get(plain_report, "run"), "peak_reserved_bytes").get<int64_t>();
  const int64_t plain_allocated =
      Get(Get(plain_report, "run"), "peak_allocated_bytes").get<int64_t>();

  BudgetOptions options;
  // 80% of what plain training reserved, less than it allocated: it needs packing to fit.
  options.limit = std::to_string(plain_peak * 8 / 10);
  ASSERT_LT(plain_peak * 8 / 10, plain_allocated);
  const std::string path = ::testing::TempDir() + "/budget_auto.json";
  options.report = path;
  json::Value report;
  const Training packed = Train(&options, kSteps, kWidth, kBatch, &report);

  const json::Value& run = Get(report, "run");
  const int64_t budget = Get(run, "budget_bytes").get<int64_t>();
  EXPECT_EQ(budget, plain_peak * 8 / 10);
  const json::Value& steps = Get(Get(report, "activations"), "steps");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  // The cap binds once the policy has planned (after the second step), as in Python.
  int64_t capped_peak = 0;
  for (size_t i = 2; i < steps.size(); ++i) {
    EXPECT_LE(Get(steps[i], "peak_reserved_bytes").get<int64_t>(), budget) << "step " << i;
    capped_peak = std::max(capped_peak, Get(steps[i], "peak_reserved_bytes").get<int64_t>());
  }
  const json::Value& totals = Get(Get(report, "activations"), "totals");
  EXPECT_LT(Get(totals, "packed_stored_bytes").get<int64_t>(),
            Get(totals, "packed_raw_bytes").get<int64_t>());
  ASSERT_LT(plain.losses.back(), plain.losses.front() * 0.5);  // the task is learnable
  const double final_plain = MeanOfLast(plain.losses, 5);
  const double final_packed = MeanOfLast(packed.losses, 5);
  EXPECT_NEAR(final_packed, final_plain, 0.05 * final_plain);
  std::cout << "plain reserved peak " << plain_peak << " B (allocated " << plain_allocated
            << "), budget " << budget << " B, capped steps at most " << capped_peak
            << " B; final loss (mean of the last 5) plain " << final_plain << ", actpack "
            << final_packed << "\n";

  // The same document is on disk, with the schema and version the Python context writes.
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<json::Value> written = json::Parse(text.str());
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, report);
  EXPECT_EQ(Get(report, "schema").get_ref<const std::string&>(), "actpack.report");
  EXPECT_EQ(Get(report, "actpack_version").get_ref<const std::string&>(), kVersion);
  EXPECT_EQ(Get(Get(report, "allocator"), "allocator").get_ref<const std::string&>(), "actpack");
}

TEST(BudgetTest, ModuleScopesNameSavedTensorsAndRulesPickTheirCodecs) {
  BudgetOptions options;
  options.limit = "1GiB";
  options.codec = "identity";
  options.rules = {{"enc*", "quant2"}};
  options.min_bytes = "4KiB";
  json::Value report;
  Train(&options, 2, 64, 64, &report);
  int encoder = 0, head = 0;
  for (const json::Value& saved : Get(Get(report, "activations"), "saved_tensors")) {
    const json::Value* module = json::Find(saved, "module");
    const std::string codec = Get(saved, "codec").get_ref<const std::string&>();
    if (module == nullptr || codec == "none" || codec == "reused") continue;
    if (module->get_ref<const std::string&>() == "encoder") {
      ++encoder;
      EXPECT_EQ(codec.rfind("quant2", 0), 0u) << codec;
    } else if (module->get_ref<const std::string&>() == "head") {
      ++head;
      EXPECT_EQ(codec, "identity");
    }
  }
  EXPECT_GT(encoder, 0);
  EXPECT_GT(head, 0);
  EXPECT_EQ(Get(Get(report, "run"), "codec"),
            *json::Parse(R"({"enc*": "quant2", "*": "identity"})"));
}

TEST(BudgetTest, ClosingRestoresTheCpuAllocatorAndALaterBackwardStillUnpacks) {
  ASSERT_FALSE(torch_plugin::CpuAllocatorInstalled());
  Net net(64);
  torch::Tensor loss;
  int64_t steps = 0;
  {
    BudgetOptions options;
    options.limit = "1GiB";
    options.codec = "quant8";
    options.min_bytes = "0";
    Budget budget(options);
    EXPECT_TRUE(torch_plugin::CpuAllocatorInstalled());
    loss = net.forward(torch::randn({16, 32})).square().mean();
    budget.Close();
    steps = budget.steps();
  }
  EXPECT_FALSE(torch_plugin::CpuAllocatorInstalled());
  loss.backward();  // decodes what the closed budget packed
  EXPECT_EQ(steps, 0);
  EXPECT_TRUE(net.fc1->weight.grad().defined());
  EXPECT_TRUE(torch::isfinite(net.fc1->weight.grad()).all().item<bool>());
}

TEST(BudgetTest, AnExceptionInsideTheBudgetStillWritesTheReport) {
  const std::string path = ::testing::TempDir() + "/budget_exception.json";
  std::remove(path.c_str());
  try {
    BudgetOptions options;
    options.limit = "1GiB";
    options.report = path;
    Budget budget(options);
    throw std::runtime_error("the data loader failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(torch_plugin::CpuAllocatorInstalled());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<json::Value> report = json::Parse(text.str());
  ASSERT_TRUE(report.ok()) << report.status();
  const json::Value& warnings = Get(Get(*report, "run"), "warnings");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0].get_ref<const std::string&>(), HasSubstr("exception"));
}

// ---- The scenarios both front ends run (torch_plugin/testdata/budget_scenarios.json; the
// Python context runs them in tests/test_budget_scenarios.py) ----

const json::Value& Scenarios() {
  static const json::Value* scenarios = [] {
    std::ifstream file("torch_plugin/testdata/budget_scenarios.json");
    std::stringstream text;
    text << file.rdbuf();
    absl::StatusOr<json::Value> parsed = json::Parse(text.str());
    if (!parsed.ok()) {
      std::cerr << "budget_scenarios.json: " << parsed.status() << "\n";
      std::abort();
    }
    return new json::Value(*std::move(parsed));
  }();
  return *scenarios;
}

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const json::Value& scenario : Scenarios()["scenarios"]) {
    names.push_back(scenario["name"].get<std::string>());
  }
  return names;
}

const json::Value& ScenarioNamed(const std::string& name) {
  for (const json::Value& scenario : Scenarios()["scenarios"]) {
    if (scenario["name"] == name) return scenario;
  }
  std::abort();
}

class BudgetScenarioTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BudgetScenarioTest, RunsAsThePythonContextDoes) {
  const json::Value& model = Scenarios()["model"];
  // Net and Train have these built in.
  ASSERT_EQ(model["inputs"], 32);
  ASSERT_EQ(model["classes"], 10);
  ASSERT_EQ(model["lr"], 0.003);
  const json::Value& scenario = ScenarioNamed(GetParam());
  BudgetOptions options;
  options.limit = scenario["limit"].get<std::string>();
  options.codec = scenario["codec"].get<std::string>();
  options.min_bytes = scenario["min_bytes"].get<std::string>();
  const json::Value& expect = scenario["expect"];
  const int steps = model["steps"].get<int>();
  const int64_t width = model["width"].get<int64_t>();
  const int64_t batch = model["batch"].get<int64_t>();
  json::Value report;
  if (const json::Value* errors = json::Find(expect, "error")) {
    try {
      Train(&options, steps, width, batch, &report);
      FAIL() << "trained under " << options.limit;
    } catch (const c10::OutOfMemoryError& error) {
      for (const json::Value& text : *errors) {
        EXPECT_THAT(error.what(), HasSubstr(text.get<std::string>()));
      }
    }
    EXPECT_FALSE(torch_plugin::CpuAllocatorInstalled());
    return;
  }
  Train(&options, steps, width, batch, &report);
  const json::Value& run = Get(report, "run");
  std::vector<std::string> keys;
  for (const auto& [key, value] : run.items()) keys.push_back(key);
  EXPECT_EQ(keys, Scenarios()["run_keys"].get<std::vector<std::string>>());
  EXPECT_EQ(Get(run, "budget_bytes"), expect["budget_bytes"]);
  EXPECT_LE(Get(run, "peak_reserved_bytes").get<uint64_t>(), expect["budget_bytes"].get<uint64_t>());
  EXPECT_TRUE(Get(run, "warnings").empty()) << Get(run, "warnings");
  EXPECT_EQ(Get(report, "activations")["totals"]["steps"], steps);
}

INSTANTIATE_TEST_SUITE_P(Shared, BudgetScenarioTest, ::testing::ValuesIn(ScenarioNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Each bad option of the shared file: the message actpack.budget raises, word for word.
TEST(BudgetScenarioTest, RefusesEachBadOptionWithThePythonContextsMessage) {
  const json::Value& cases = Scenarios()["bad_options"];
  ASSERT_GE(cases.size(), 10u);
  for (const json::Value& bad : cases) {
    BudgetOptions options;
    options.limit = "1GiB";
    for (const auto& [name, value] : bad["options"].items()) {
      if (name == "limit") {
        options.limit = value.get<std::string>();
      } else if (name == "codec") {
        options.codec = value.get<std::string>();
      } else if (name == "min_bytes") {
        options.min_bytes = value.get<std::string>();
      } else if (name == "recompute") {
        options.recompute = value.get<std::string>();
      } else if (name == "headroom") {
        options.headroom = value.get<double>();
      } else if (name == "profile_every") {
        options.profile_every = value.get<int64_t>();
      } else if (name == "max_rel_rms") {
        options.max_rel_rms = value.get<double>();
      } else if (name == "allowed_loss_increase") {
        options.allowed_loss_increase = value.get<double>();
      } else {
        FAIL() << "an option this test does not set: " << name;
      }
    }
    try {
      Budget budget(options);
      ADD_FAILURE() << "accepted " << bad["options"];
    } catch (const c10::ValueError& error) {
      EXPECT_EQ(error.msg(), bad["error"].get<std::string>());
    }
    EXPECT_FALSE(torch_plugin::CpuAllocatorInstalled());
  }
}

std::vector<std::string> RunawayNames() {
  std::vector<std::string> names;
  for (const json::Value& scenario : Scenarios()["runaways"]) {
    names.push_back(scenario["name"].get<std::string>());
  }
  return names;
}

class RunawayScenarioTest : public ::testing::TestWithParam<std::string> {};

// The gradient guard of the C++ guard, fed the parameters' gradient norms, reacts to the shared
// runaway as the Python context's does: the same steps dropped, the same step stopped in.
TEST_P(RunawayScenarioTest, ReactsAsThePythonContextDoes) {
  const json::Value* found = nullptr;
  for (const json::Value& scenario : Scenarios()["runaways"]) {
    if (scenario["name"] == GetParam()) found = &scenario;
  }
  ASSERT_NE(found, nullptr);
  const json::Value& scenario = *found;
  const json::Value& model = Scenarios()["model"];
  Net net(model["width"].get<int64_t>());
  torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(3e-3));
  torch::manual_seed(1);
  const torch::Tensor teacher = torch::randn({32, 10});
  BudgetOptions options;
  options.limit = "1GiB";
  options.codec = scenario["codec"].get<std::string>();
  options.max_rel_rms = scenario["max_rel_rms"].get<double>();
  const int steps = scenario["steps"].get<int>();
  const int from = scenario["scaled_from"].get<int>();
  const json::Value* until_value = json::Find(scenario, "scaled_until");
  const int until = until_value != nullptr ? until_value->get<int>() : steps;
  const double scale = scenario["scale"].get<double>();
  std::vector<int> dropped;
  std::optional<int> stopped_in;
  std::string message;
  {
    Budget budget(options, net.named_parameters().pairs());
    for (int n = 1; n <= steps; ++n) {
      const torch::Tensor x = torch::randn({model["batch"].get<int64_t>(), 32});
      const torch::Tensor y = torch::matmul(x, teacher).argmax(1);
      const torch::Tensor loss = torch::nn::functional::cross_entropy(net.forward(x), y) *
                                 (from <= n && n <= until ? scale : 1.0);
      opt.zero_grad();
      try {
        loss.backward();
      } catch (const GradientRunaway& error) {
        stopped_in = n;
        message = error.what();
        break;
      }
      bool none = true;
      for (const torch::Tensor& p : net.parameters()) none = none && !p.grad().defined();
      if (none) dropped.push_back(n);
      opt.step();
    }
  }
  const json::Value& expect = scenario["expect"];
  EXPECT_EQ(dropped, expect["dropped"].get<std::vector<int>>()) << message;
  if (expect["stopped_in"].is_null()) {
    EXPECT_EQ(stopped_in, std::nullopt) << message;
  } else {
    EXPECT_EQ(stopped_in, expect["stopped_in"].get<int>()) << message;
  }
  for (const json::Value& text : expect["error"]) {
    EXPECT_THAT(message, HasSubstr(text.get<std::string>()));
  }
  for (const torch::Tensor& p : net.parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Shared, RunawayScenarioTest, ::testing::ValuesIn(RunawayNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(BudgetTest, BadOptionsFailBeforeTrainingNamingTheValue) {
  BudgetOptions options;
  options.limit = "6 gigs";
  EXPECT_THROW(
      {
        try {
          Budget budget(options);
        } catch (const c10::ValueError& error) {
          EXPECT_THAT(error.what(), HasSubstr("6 gigs"));
          throw;
        }
      },
      c10::ValueError);
  options.limit = "1GiB";
  options.codec = "quant3";
  EXPECT_THROW(Budget{options}, c10::ValueError);
  options.codec = "quant2";
  options.allowed_loss_increase = 0.01;
  EXPECT_THROW(Budget{options}, c10::ValueError);
  options = BudgetOptions();
  EXPECT_THROW(Budget{options}, c10::ValueError);  // no limit
  EXPECT_FALSE(torch_plugin::CpuAllocatorInstalled());
}

}  // namespace
}  // namespace actpack
