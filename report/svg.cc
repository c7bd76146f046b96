#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "allocator/units.h"

namespace actpack::report {
namespace {

using allocator::FormatBytes;

std::string XmlEscape(absl::string_view text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

// A byte axis from 0 to `top` with ticks every `step`, labelled in `unit_name`.
struct ByteAxis {
  double top = 1;
  double step = 1;
  double unit = 1;
  std::string unit_name = "B";

  std::string Label(double bytes) const {
    return absl::StrFormat("%g %s", std::round(bytes / unit * 1000.0) / 1000.0, unit_name);
  }
};

// Chooses the unit (B, KiB, MiB, GiB, TiB) and a 1-2-2.5-5 tick step giving about 5 ticks.
ByteAxis NiceByteAxis(double max_bytes) {
  ByteAxis axis;
  if (!(max_bytes > 0)) max_bytes = 1;
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && max_bytes / std::pow(1024.0, unit) >= 1024.0) ++unit;
  axis.unit = std::pow(1024.0, unit);
  axis.unit_name = kUnits[unit];
  const double in_unit = max_bytes / axis.unit;
  const double rough = in_unit / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  double nice = magnitude;
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    nice = factor * magnitude;
    if (nice >= rough) break;
  }
  if (unit == 0) nice = std::max(1.0, std::round(nice));
  axis.step = nice * axis.unit;
  axis.top = std::ceil(in_unit / nice - 1e-9) * nice * axis.unit;
  if (axis.top <= 0) axis.top = axis.step;
  return axis;
}

constexpr absl::string_view kRawColor = "#9aa5b1";
constexpr absl::string_view kStoredColor = "#1f77b4";
constexpr absl::string_view kBudgetColor = "#d62728";
constexpr absl::string_view kReservedColor = "#2ca02c";
constexpr absl::string_view kAllocatedColor = "#ff7f0e";
constexpr absl::string_view kSystemColor = "#9467bd";

void AppendText(std::string* svg, double x, double y, absl::string_view text,
                absl::string_view anchor = "start", absl::string_view extra = "") {
  absl::StrAppendFormat(svg, "  <text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x,
                        y, anchor, extra, XmlEscape(text));
}

void AppendRect(std::string* svg, double x, double y, double width, double height,
                absl::string_view color, absl::string_view title) {
  absl::StrAppendFormat(svg,
                        "  <rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"%s\"><title>%s</title></rect>\n",
                        x, y, std::max(width, 0.0), std::max(height, 0.0), color,
                        XmlEscape(title));
}

void AppendLine(std::string* svg, double x1, double y1, double x2, double y2,
                absl::string_view color, absl::string_view extra = "") {
  absl::StrAppendFormat(svg,
                        "  <line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"%s/>\n",
                        x1, y1, x2, y2, color, extra);
}

void AppendLegendEntry(std::string* svg, double x, double y, absl::string_view color,
                       absl::string_view label, bool dashed_line = false) {
  if (dashed_line) {
    AppendLine(svg, x, y - 4, x + 18, y - 4, color,
               " stroke-width=\"2\" stroke-dasharray=\"6 3\"");
  } else if (absl::StrContains(label, "peak")) {  // a line with markers
    AppendLine(svg, x, y - 4, x + 18, y - 4, color, " stroke-width=\"2\"");
  } else {
    AppendRect(svg, x, y - 10, 18, 10, color, label);
  }
  AppendText(svg, x + 24, y, label);
}

}  // namespace

std::string RenderMemorySvg(const RunReport& report) {
  constexpr double kWidth = 960;
  constexpr double kLeft = 100;   // room for byte tick labels
  constexpr double kRight = 40;
  constexpr double kStepTop = 96;
  constexpr double kStepHeight = 240;
  constexpr double kConsumerLeft = 220;  // room for module or producer names
  constexpr double kRowHeight = 28;
  constexpr size_t kMaxConsumers = 10;

  absl::string_view kind;
  const std::vector<ConsumerUsage>& consumers = report.ShownConsumers(&kind);
  const size_t consumer_rows = std::max<size_t>(1, std::min(kMaxConsumers, consumers.size()));
  const double consumer_top = kStepTop + kStepHeight + 110;
  const double consumer_height = consumer_rows * kRowHeight;
  const double height = consumer_top + consumer_height + 70;

  std::string svg;
  absl::StrAppendFormat(&svg,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                        "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, "
                        "sans-serif\" font-size=\"12\">\n",
                        kWidth, height, kWidth, height);
  absl::StrAppendFormat(&svg, "  <rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", kWidth,
                        height);
  std::string title = absl::StrCat("actpack memory: ", report.FileName());
  std::vector<std::string> facts;
  if (report.codec) facts.push_back(absl::StrCat("codec ", *report.codec));
  if (report.device) facts.push_back(absl::StrCat("device ", *report.device));
  if (report.budget_bytes) {
    facts.push_back(absl::StrCat("budget ", FormatBytes(*report.budget_bytes)));
  }
  if (!facts.empty()) absl::StrAppend(&title, " (", absl::StrJoin(facts, ", "), ")");
  AppendText(&svg, kWidth / 2, 28, title, "middle", " font-size=\"16\" font-weight=\"bold\"");

  // Panel 1: bytes saved for backward per step, raw vs stored, with the budget line.
  const double plot_left = kLeft;
  const double plot_width = kWidth - kLeft - kRight;
  const double plot_bottom = kStepTop + kStepHeight;
  const bool has_peaks = std::any_of(report.steps.begin(), report.steps.end(), [](const auto& s) {
    return s.peak_reserved_bytes.has_value() || s.peak_allocated_bytes.has_value() ||
           s.system_peak_bytes.has_value();
  });
  const bool has_system = std::any_of(report.steps.begin(), report.steps.end(),
                                      [](const auto& s) { return s.system_peak_bytes.has_value(); });
  AppendText(&svg, plot_left, kStepTop - 44,
             has_peaks ? "memory per training step: activations saved for backward and the "
                         "step's peak"
                       : "activations saved for backward, per training step",
             "start", " font-size=\"13\" font-weight=\"bold\"");
  // Legend, one row above the plot.
  {
    double x = plot_left;
    const double y = kStepTop - 22;
    AppendLegendEntry(&svg, x, y, kRawColor, "saved raw (without actpack)");
    x += 200;
    AppendLegendEntry(&svg, x, y, kStoredColor, "stored by actpack");
    x += 140;
    if (has_peaks) {
      AppendLegendEntry(&svg, x, y, kReservedColor, "step peak reserved");
      x += 150;
      AppendLegendEntry(&svg, x, y, kAllocatedColor, "step peak allocated");
      x += 160;
    }
    if (has_system) {
      AppendLegendEntry(&svg, x, y, kSystemColor, "step peak, system's count");
      x += 190;
    }
    if (report.budget_bytes) AppendLegendEntry(&svg, x, y, kBudgetColor, "budget", true);
  }
  if (report.steps.empty()) {
    AppendText(&svg, plot_left + plot_width / 2, kStepTop + kStepHeight / 2,
               "no per-step data in this report", "middle");
  } else {
    double max_bytes = 0;
    for (const StepUsage& step : report.steps) {
      max_bytes = std::max({max_bytes, static_cast<double>(step.saved_raw_bytes),
                            static_cast<double>(step.stored_bytes),
                            static_cast<double>(step.peak_reserved_bytes.value_or(0)),
                            static_cast<double>(step.peak_allocated_bytes.value_or(0)),
                            static_cast<double>(step.system_peak_bytes.value_or(0))});
    }
    // The budget joins the scale unless it would flatten the bars; then it is stated instead.
    bool budget_on_scale = false;
    if (report.budget_bytes && *report.budget_bytes > 0 &&
        static_cast<double>(*report.budget_bytes) <= 8 * std::max(max_bytes, 1.0)) {
      max_bytes = std::max(max_bytes, static_cast<double>(*report.budget_bytes));
      budget_on_scale = true;
    }
    const ByteAxis axis = NiceByteAxis(max_bytes);
    auto y_of = [&](double bytes) { return plot_bottom - bytes / axis.top * kStepHeight; };
    for (double tick = 0; tick <= axis.top * (1 + 1e-9); tick += axis.step) {
      const double y = y_of(tick);
      AppendLine(&svg, plot_left, y, plot_left + plot_width, y, "#e5e5e5");
      AppendText(&svg, plot_left - 8, y + 4, axis.Label(tick), "end");
    }
    const size_t n = report.steps.size();
    const double slot = plot_width / n;
    const double bar = std::max(1.0, slot * 0.36);
    const size_t label_every = std::max<size_t>(1, (n + 19) / 20);
    for (size_t i = 0; i < n; ++i) {
      const StepUsage& step = report.steps[i];
      const double x = plot_left + i * slot + slot * 0.14;
      AppendRect(&svg, x, y_of(step.saved_raw_bytes), bar,
                 plot_bottom - y_of(step.saved_raw_bytes), kRawColor,
                 absl::StrCat("step ", step.index, ": saved raw ",
                              FormatBytes(step.saved_raw_bytes)));
      AppendRect(&svg, x + bar, y_of(step.stored_bytes), bar,
                 plot_bottom - y_of(step.stored_bytes), kStoredColor,
                 absl::StrCat("step ", step.index, ": stored ", FormatBytes(step.stored_bytes)));
      if (i % label_every == 0) {
        AppendText(&svg, plot_left + (i + 0.5) * slot, plot_bottom + 16,
                   absl::StrCat(step.index), "middle");
      }
    }
    // The step's peaks as lines through the slots' centres, a marker per step.
    auto draw_peaks = [&](auto peak_of, absl::string_view color, absl::string_view what) {
      std::optional<std::pair<double, double>> previous;
      for (size_t i = 0; i < n; ++i) {
        const std::optional<uint64_t> peak = peak_of(report.steps[i]);
        if (!peak.has_value()) {
          previous.reset();
          continue;
        }
        const double x = plot_left + (i + 0.5) * slot;
        const double y = y_of(static_cast<double>(*peak));
        if (previous) {
          AppendLine(&svg, previous->first, previous->second, x, y, color,
                     " stroke-width=\"2\"");
        }
        absl::StrAppendFormat(&svg,
                              "  <circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\">"
                              "<title>step %d: %s %s</title></circle>\n",
                              x, y, color, i, what, FormatBytes(*peak));
        previous = std::make_pair(x, y);
      }
    };
    draw_peaks([](const StepUsage& s) { return s.peak_reserved_bytes; }, kReservedColor,
               "peak reserved");
    draw_peaks([](const StepUsage& s) { return s.peak_allocated_bytes; }, kAllocatedColor,
               "peak allocated");
    draw_peaks([](const StepUsage& s) { return s.system_peak_bytes; }, kSystemColor,
               "peak, system's count");
    if (report.budget_bytes) {
      if (budget_on_scale) {
        const double y = y_of(static_cast<double>(*report.budget_bytes));
        AppendLine(&svg, plot_left, y, plot_left + plot_width, y, kBudgetColor,
                   " stroke-width=\"2\" stroke-dasharray=\"6 3\"");
        AppendText(&svg, plot_left + plot_width - 4, y - 6,
                   absl::StrCat("budget ", FormatBytes(*report.budget_bytes)), "end",
                   absl::StrCat(" fill=\"", kBudgetColor, "\""));
      } else {
        // Above the plot area, under the legend, so that it never covers a bar.
        AppendText(&svg, plot_left + plot_width, kStepTop - 8,
                   absl::StrCat("budget ", FormatBytes(*report.budget_bytes),
                                " is far above this scale"),
                   "end", absl::StrCat(" font-size=\"11\" fill=\"", kBudgetColor, "\""));
      }
    }
  }
  AppendLine(&svg, plot_left, kStepTop, plot_left, plot_bottom, "#333333");
  AppendLine(&svg, plot_left, plot_bottom, plot_left + plot_width, plot_bottom, "#333333");
  AppendText(&svg, plot_left + plot_width / 2, plot_bottom + 36, "training step", "middle");
  AppendText(&svg, 0, 0, "bytes per step", "middle",
             absl::StrFormat(" transform=\"translate(22 %.1f) rotate(-90)\"",
                             kStepTop + kStepHeight / 2));

  // Panel 2: per-module (or per-producer) bytes per step, raw vs stored, as horizontal bars.
  const uint64_t steps = report.StepCountForAverages();
  const double bars_left = kConsumerLeft;
  const double bars_width = kWidth - kConsumerLeft - kRight - 170;  // room for value labels
  const double bars_bottom = consumer_top + consumer_height;
  AppendText(&svg, plot_left, consumer_top - 30,
             absl::StrCat("top consumers by ", kind, " (bytes per step, average over ", steps,
                          steps == 1 ? " step)" : " steps)"),
             "start", " font-size=\"13\" font-weight=\"bold\"");
  if (consumers.empty()) {
    AppendText(&svg, bars_left + bars_width / 2, consumer_top + kRowHeight / 2,
               "no saved tensors in this report", "middle");
  } else {
    const ByteAxis axis =
        NiceByteAxis(static_cast<double>(consumers.front().raw_bytes) / steps);
    auto x_of = [&](double bytes) { return bars_left + bytes / axis.top * bars_width; };
    for (double tick = 0; tick <= axis.top * (1 + 1e-9); tick += axis.step) {
      const double x = x_of(tick);
      AppendLine(&svg, x, consumer_top, x, bars_bottom, "#e5e5e5");
      AppendText(&svg, x, bars_bottom + 16, axis.Label(tick), "middle");
    }
    for (size_t i = 0; i < consumer_rows; ++i) {
      const ConsumerUsage& p = consumers[i];
      const double raw = static_cast<double>(p.raw_bytes) / steps;
      const double stored = static_cast<double>(p.stored_bytes) / steps;
      const double y = consumer_top + i * kRowHeight + 4;
      AppendText(&svg, bars_left - 8, y + 14, p.name, "end");
      AppendRect(&svg, bars_left, y, x_of(raw) - bars_left, 10, kRawColor,
                 absl::StrCat(p.name, ": raw ", FormatBytes(p.raw_bytes / steps)));
      AppendRect(&svg, bars_left, y + 10, x_of(stored) - bars_left, 10, kStoredColor,
                 absl::StrCat(p.name, ": stored ", FormatBytes(p.stored_bytes / steps), " (",
                              absl::StrJoin(p.codecs, "+"), ")"));
      AppendText(&svg, x_of(raw) + 6, y + 14,
                 absl::StrCat(FormatBytes(p.stored_bytes / steps), " stored of ",
                              FormatBytes(p.raw_bytes / steps)),
                 "start", " font-size=\"10\" fill=\"#555555\"");
    }
  }
  AppendLine(&svg, bars_left, consumer_top, bars_left, bars_bottom, "#333333");
  AppendLine(&svg, bars_left, bars_bottom, bars_left + bars_width, bars_bottom, "#333333");
  AppendText(&svg, bars_left + bars_width / 2, bars_bottom + 36,
             "bytes per step (grey: saved raw, blue: stored by actpack)", "middle");
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace actpack::report
