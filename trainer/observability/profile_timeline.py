"""Where the profiled steps' device time went: busy or idle, and on which kinds of kernel.

    text, line = timeline_report(device_intervals(prof), iterations)

The operator table (trainer.observability.profiling) sums kernel time per name; it cannot say how long the device sat idle
between kernels (host-side overhead: launches, Python, synchronisation), and its sums double-count kernels
that run side by side (communication beside a GEMM). This report takes every device kernel's interval:

* span: first kernel start to last kernel end; busy: the union of all kernel intervals; idle = span - busy;
* the longest idle gaps, with where they start (ms into the span) and the kernel before them;
* kernel time by kind (gemm, attention, communication, copy, other): sums, so side-by-side kernels each count.
"""
from __future__ import annotations

KINDS = (  # first match wins: cuDNN's attention kernels name their wgmma tiles too
    ("attention", ("flash", "fmha", "sdpa", "attn", "dot_do_o")),  # cuDNN's backward dO·O reduction too
    ("gemm", ("gemm", "nvjet", "cutlass", "cublas", "xmma", "wgmma")),
    ("communication", ("nccl", "userbuffers")),
    ("copy", ("memcpy", "memset")),
)
GAPS = 5


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KINDS if any(m in low for m in marks)), "other")


def device_intervals(prof) -> list[tuple[float, float, str]]:
    """(start_us, end_us, name) of every device-side kernel/copy a finished torch.profiler run recorded.

    GPU user annotations (NCCL's `nccl:_reduce_scatter_base` spans its own kernel) are left out: a 70B H200
    profile counted every collective twice with them."""
    from torch.autograd import DeviceType

    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if getattr(e, "device_type", None) == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
            and e.time_range.end > e.time_range.start]


def timeline(intervals) -> dict:
    """Span, busy (union), idle, the longest gaps and per-kind sums of (start_us, end_us, name) intervals."""
    ivs = sorted(intervals)
    if not ivs:
        return {}
    busy, gaps, by_kind = 0.0, [], {kind: 0.0 for kind, _ in KINDS} | {"other": 0.0}
    cur_start, cur_end, cur_name = ivs[0]
    for start, end, name in ivs:
        by_kind[kernel_kind(name)] += end - start
        if start > cur_end:  # a gap: close the busy run
            busy += cur_end - cur_start
            gaps.append((start - cur_end, cur_end - ivs[0][0], cur_name))
            cur_start = start
        if end >= cur_end:
            cur_end, cur_name = end, name
    busy += cur_end - cur_start
    span = cur_end - ivs[0][0]
    return {"span_us": span, "busy_us": busy, "idle_us": span - busy, "gaps": sorted(gaps, reverse=True)[:GAPS],
            "by_kind_us": by_kind, "kernels": len(ivs)}


def timeline_report(intervals, iterations: str) -> tuple[str, str]:
    """(text for summary.txt, one log line); ("", "") without device events."""
    t = timeline(intervals)
    if not t:
        return "", ""
    ms = 1e-3
    pct = 100.0 * t["busy_us"] / t["span_us"] if t["span_us"] else 0.0
    lines = [f"device timeline, iterations {iterations}: {t['kernels']} kernels, span {t['span_us'] * ms:.1f} ms, "
             f"busy {t['busy_us'] * ms:.1f} ms ({pct:.1f} %), idle {t['idle_us'] * ms:.1f} ms",
             "kernel time by kind (side-by-side kernels each count): " + ", ".join(
                 f"{k} {v * ms:.1f} ms" for k, v in t["by_kind_us"].items()),
             "longest idle gaps (length, at, after kernel):"]
    lines += [f"  {g * ms:.3f} ms at {at * ms:.1f} ms after {name[:80]}" for g, at, name in t["gaps"]]
    line = (f"device timeline | iterations {iterations} | busy {pct:.1f} % of {t['span_us'] * ms:.1f} ms | idle "
            f"{t['idle_us'] * ms:.1f} ms | gemm {t['by_kind_us']['gemm'] * ms:.1f} ms")
    return "\n".join(lines) + "\n", line
