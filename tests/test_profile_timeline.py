"""trainer.observability.profile_timeline: busy/idle time of the device from kernel intervals (the GPU profile's last section)."""
import pytest

from trainer.observability.profile_timeline import kernel_kind, timeline, timeline_report

# (start_us, end_us, name): a GEMM with a reduce-scatter beside it, a gap, attention, a long gap, a copy
KERNELS = [
    (0.0, 1000.0, "nvjet_sm90_qqtst_320x128_128x3_1x2_h_bz_coopB_TNT"),
    (200.0, 700.0, "userbuffers_fp16_sum_inplace_gpu_rr_rs_oop<2>"),
    (1100.0, 1600.0, "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"),
    (1500.0, 1550.0, "triton_poi_fused_mul_silu_split_0"),
    (2600.0, 2650.0, "Memcpy DtoD (Device -> Device)"),
]


def test_union_gaps_and_kinds():
    t = timeline(KERNELS)
    assert t["span_us"] == 2650.0 and t["busy_us"] == 1000.0 + 500.0 + 50.0 and t["idle_us"] == 1100.0
    # longest first: 1000 us after the attention kernel (the silu inside it does not end the busy run), then 100 us
    assert [(g, at) for g, at, _ in t["gaps"]] == [(1000.0, 1600.0), (100.0, 1000.0)]
    assert "sdpa" in t["gaps"][0][2] and "nvjet" in t["gaps"][1][2]
    assert t["by_kind_us"] == {"gemm": 1000.0, "attention": 500.0, "communication": 500.0, "copy": 50.0,
                               "other": 50.0}


def test_report_text_and_log_line():
    text, line = timeline_report(list(reversed(KERNELS)), "8-9")  # order of the events does not matter
    assert text.startswith("device timeline, iterations 8-9: 5 kernels, span 2.6 ms, busy 1.6 ms (58.5 %), idle 1.1 ms")
    assert "  1.000 ms at 1.6 ms after cudnn_generated" in text
    assert line == "device timeline | iterations 8-9 | busy 58.5 % of 2.6 ms | idle 1.1 ms | gemm 1.0 ms"
    assert timeline_report([], "1-2") == ("", "")


@pytest.mark.parametrize("name,kind", [("ampere_bf16_s16816gemm_bf16_128x64", "gemm"),
                                       ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "communication"),
                                       ("void at::native::vectorized_elementwise_kernel<8>", "other"),
                                       ("flash_fwd_kernel", "attention"), ("Memset (Device)", "copy"),
                                       # a 70B H200 profile's cuDNN attention (it was counted as gemm)
                                       ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7", "attention"),
                                       ("void cudnn::fusion::compute_dot_do_o_ragged_specialized<true>", "attention"),
                                       ("nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_TNN", "gemm")])
def test_kernel_kinds(name, kind):
    assert kernel_kind(name) == kind


def test_device_intervals_keep_kernels_and_drop_gpu_user_annotations():
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    from trainer.observability.profile_timeline import device_intervals

    def event(i, name, start, end, device=DeviceType.CUDA, annotation=False):
        return FunctionEvent(id=i, name=name, thread=0, start_us=start, end_us=end, device_type=device,
                             is_user_annotation=annotation)

    class Finished:  # what device_intervals reads of a finished torch.profiler.profile
        def events(self):
            return EventList([event(1, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 10, 30),
                              event(2, "nccl:_reduce_scatter_base", 10, 30, annotation=True),
                              event(3, "aten::mm", 0, 40, device=DeviceType.CPU),
                              event(4, "empty", 50, 50)])

    assert device_intervals(Finished()) == [(10, 30, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")]
