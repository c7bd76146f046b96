"""The GPU check's diagnosis tools, on the CPU: tools/gpu_counters.py matches Nsight Compute's
rows to the calls that launched them (by the launch order torch.profiler saw, names checked),
and tools/gpu_triage.py gives each case a verdict naming the phase it stopped in."""
import os
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")
sys.path.insert(0, TOOLS)
import gpu_counters  # noqa: E402
import gpu_triage  # noqa: E402

# ncu --csv --page raw: a header, a units row, a row per kernel (numbers with separators), and
# ncu's own lines around them.
NCU_CSV = '''==PROF== Connected to process 77
"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
"","","","nsecond","byte","byte","ratio","ratio","ratio"
"0","77","void actpack::codecs::cuda::(anonymous namespace)::QuantEncodeKernel<2, (int)0>(const void *, unsigned int *)","120,500","268,435,456","33,554,432","4.5","0.5","1.5"
"1","77","ChecksumKernel(const unsigned char *, unsigned long)","9,000","33,554,432","0","0.2","0.9","0"
"2","77","void actpack::codecs::cuda::QuantDecodeKernel<2>(const unsigned int *, float *)","80,000","33,554,432","268,435,456","3","0.1","0"
==PROF== Disconnected from process 77
'''

SEQUENCE = [
    {"call": "quant2 float32 256MiB encode",
     "kernels": ["void actpack::codecs::cuda::(anonymous namespace)::QuantEncodeKernel<2, "
                 "(int)0>(void const*, unsigned int*)", "ChecksumKernel(unsigned char const*, "
                 "unsigned long)"]},
    {"call": "quant2 float32 256MiB decode",
     "kernels": ["void actpack::codecs::cuda::QuantDecodeKernel<2>(unsigned int const*, "
                 "float*)"]},
]


def test_kernel_names_compare_without_namespaces_templates_or_parameters():
    assert gpu_counters.short(SEQUENCE[0]["kernels"][0]) == "QuantEncodeKernel"
    assert gpu_counters.short("void at::native::vectorized_elementwise_kernel<4, "
                              "at::native::FillFunctor<float>, std::array<char *, 1> >(int)") \
        == "vectorized_elementwise_kernel"
    assert gpu_counters.short("ChecksumKernel") == "ChecksumKernel"


def test_ncu_rows_go_to_the_calls_that_launched_them():
    rows = gpu_counters.parse_csv(NCU_CSV)
    assert [r["ID"] for r in rows] == ["0", "1", "2"]  # the units row and ncu's lines dropped
    matched, problem = gpu_counters.match(SEQUENCE, rows)
    assert problem is None
    assert [(r["call"], r["kernel"]) for r in matched] == [
        ("quant2 float32 256MiB encode", "QuantEncodeKernel"),
        ("quant2 float32 256MiB encode", "ChecksumKernel"),
        ("quant2 float32 256MiB decode", "QuantDecodeKernel")]
    assert not any("name_mismatch" in r for r in matched)
    first = matched[0]
    assert first["duration"] == 120500 and first["dram_read"] == 268435456
    assert first["dram_write"] == 33554432
    assert list(first["top_stalls"]) == ["long_scoreboard", "barrier", "wait"]
    table = gpu_counters.table(matched, 256)
    assert "QuantEncodeKernel" in table and "1.12" in table  # (256 + 32) MiB over 256 MiB


def test_a_sequence_that_disagrees_with_ncu_is_marked_not_hidden():
    rows = gpu_counters.parse_csv(NCU_CSV)
    swapped = [SEQUENCE[1], SEQUENCE[0]]
    matched, problem = gpu_counters.match(swapped, rows)
    assert matched[0]["name_mismatch"] == "QuantDecodeKernel"
    assert matched[0]["kernel"] == "QuantEncodeKernel"
    _, problem = gpu_counters.match(SEQUENCE[:1], rows)
    assert problem == "ncu profiled 1 kernels beyond the sequence"
    _, problem = gpu_counters.match(SEQUENCE + SEQUENCE, rows)
    assert problem.startswith("ncu profiled 3 kernels; the sequence has more")


@pytest.fixture
def on_the_cpu(monkeypatch):
    monkeypatch.setenv("ACTPACK_TRIAGE_DEVICE", "cpu")


def test_a_case_that_runs_is_ok_and_matches_the_cpu(on_the_cpu):
    row = gpu_triage.run_case(("quant2", "float32", 1), timeout=600)
    assert row["verdict"] == "ok", row["tail"]
    assert "payload same as the CPU" in row["tail"] and "decode same as the CPU" in row["tail"]


def test_a_case_that_fails_names_the_phase_it_stopped_in(on_the_cpu):
    row = gpu_triage.run_case(("nosuchcodec", "float32", 1), timeout=600)
    assert row["verdict"] == "failed in encode (exit 1)"
    assert "unknown codec 'nosuchcodec'" in row["tail"]
