"""benchmarks/kernel_profile.py: device time by kind, busy vs summed time across streams, and
CPU operators' own time, on hand-made traces whose answers are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from kernel_profile import Interval, breakdown, device_intervals, kind_of, operator_self_time, union_length  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, 512, true, 1>", "batchnorm"),
    ("void cudnn::bn_bw_1C11_singleread_specialized<__nv_bfloat16>", "batchnorm"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x32x64", "convolution"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>", "convolution"),
    ("triton_red_fused__native_batch_norm_legit_functional_relu_threshold_backward_3", "compiled reduction"),
    ("triton_poi_fused_add_relu_7", "compiled pointwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor>", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy / index"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("aten::mkldnn_convolution", "convolution"),
    ("something nobody named", "other"),
])
def test_kernels_fall_in_the_kind_their_name_says(name, kind):
    assert kind_of(name) == kind


def test_busy_time_counts_overlapping_streams_once():
    ivs = [Interval("a", 0, 10, "s1"), Interval("b", 5, 10, "s2"), Interval("c", 20, 5, "s1"),
           Interval("d", 21, 2, "s2")]
    assert union_length(ivs) == 20
    assert union_length([]) == 0


def test_breakdown_per_step_by_kind_and_overlap():
    ivs = [Interval("sm90_xmma_fprop_implicit_gemm", 0, 600, "s1"),
           Interval("cudnn::bn_fw_tr_1C11_kernel", 600, 200, "s1"),
           Interval("sm90_xmma_fprop_implicit_gemm", 300, 600, "s2"),
           Interval("triton_poi_fused_add_relu_7", 1500, 4, "s2")]
    out = breakdown(ivs, steps=2, wall_seconds=0.004)
    assert out["measured"] and out["lanes"] == 2 and out["calls_per_step"] == 2.0
    assert out["summed_ms_per_step"] == pytest.approx(1.404 / 2)
    assert out["busy_ms_per_step"] == pytest.approx(0.904 / 2)  # 0..900 and 1500..1504
    assert out["span_ms_per_step"] == pytest.approx(1.504 / 2) and out["wall_ms_per_step"] == 2.0
    assert out["idle_share_of_span"] == pytest.approx(1 - 904 / 1504, abs=1e-4)
    assert out["overlap"] == pytest.approx(1404 / 904, abs=1e-3)
    kinds = {k["name"]: k for k in out["by_kind"]}
    assert kinds["convolution"]["ms_per_step"] == pytest.approx(0.6) and kinds["convolution"]["calls_per_step"] == 1
    assert sum(k["share"] for k in out["by_kind"]) == pytest.approx(1, abs=1e-3)
    assert out["top"][0]["name"] == "sm90_xmma_fprop_implicit_gemm" and out["share_under_5us"] == 0.25
    assert breakdown([], 3, 1.0) == {"measured": False, "reason": "the trace holds no device intervals"}


def test_device_intervals_are_kernels_copies_and_memsets_one_lane_per_stream():
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "ts": 3, "dur": 1, "pid": 0, "tid": 8},
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1, "dur": 9, "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5, "pid": 1, "tid": 1},
              {"ph": "i", "cat": "kernel", "name": "instant", "ts": 4}]
    assert device_intervals(events) == [Interval("k", 1, 2, "0/7"), Interval("Memcpy", 3, 1, "0/8")]


def test_operator_self_time_splits_each_span_around_what_runs_inside_it():
    op = [("outer", 0, 100, 1), ("child", 10, 20, 1), ("grandchild", 15, 5, 1), ("second", 50, 10, 1),
          ("other thread", 0, 40, 2)]
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "ts": t, "dur": d, "tid": tid} for n, t, d, tid in op]
    out = operator_self_time(events)
    own = {}
    for iv in out:
        own[iv.name] = own.get(iv.name, 0) + iv.duration
    assert own == {"outer": 70, "child": 15, "grandchild": 5, "second": 10, "other thread": 40}
    assert sum(iv.call for iv in out) == 5  # outer's three pieces are one call
    assert union_length([iv for iv in out if iv.lane == "1"]) == 100  # the thread was busy the whole span
