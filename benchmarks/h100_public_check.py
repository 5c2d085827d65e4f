"""The H100 presets beside every public number they use or are checked against.

    python -m benchmarks.h100_public_check [--preset h100:llama-3.1-8b@vllm-0.13]

These public numbers are the sources of the paper's engine (`@vllm-0.13`); the default
preset (vLLM 0.24) is fitted on real vLLM 0.24 instead (`benchmarks.fit_h100_vllm`).
Prints, for the given (kernels + host) and the kernel-only preset: the PPD paper's
decode-only TPOT (the host terms are fitted on it: in sample), its two mixed columns (not
fitted: out of sample, read as one prompt beside every decode step, see docs), and
inference-sim's TTFT (the front end is fitted on it: in sample) and ITL (out of sample; with
vLLM 0.15.1's async scheduling on and off).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from profiler.engine import BatchShape, load_cost, public
from profiler.engine.host import HostedCost


def _err(predicted: float, measured: float) -> str:
    return f"{predicted:6.1f} ({(predicted - measured) / measured:+.0%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="h100:llama-3.1-8b@vllm-0.13")
    args = parser.parse_args(argv)
    hosted = load_cost(args.preset)
    kernels = load_cost(f"{args.preset.partition('@')[0]}:kernels")
    assert isinstance(hosted, HostedCost)
    print("PPD micro-benchmark, mean TPOT ms: measured | kernels+host (err) | kernels (err)")
    print("batch | decode-only (fit) | + 1024-token prefill each step "
          "| + 128-token append each step")
    for row in public.PPD_MICROBENCHMARK:
        decode = public.micro_decode_shape(row.batch)
        full = replace(decode, num_prefill_requests=1, sum_prefill_tokens=1024)
        append = replace(decode, num_prefill_requests=1, sum_prefill_tokens=128,
                         sum_prefill_kv_tokens=2048)
        cells = []
        for shape, measured in ((decode, row.decode_only_ms), (full, row.with_full_prefill_ms),
                                (append, row.with_append_prefill_ms)):
            cells.append(f"{measured:5.1f} | {_err(hosted.step_ms(shape), measured)} | "
                         f"{_err(kernels.step_ms(shape), measured)}")
        print(f"{row.batch:5d} | " + " || ".join(cells))
    batch = public.batch_at_kernel_ms(kernels, public.SIM_TO_REAL_KERNEL_ITL_MS)
    itl_shape = BatchShape(0, 0, 0, batch, batch * 1024)
    itl_mid = sum(public.SIM_TO_REAL_ITL_MS) / 2
    ttft_mid = sum(public.SIM_TO_REAL_TTFT_MS) / 2
    asynchronous = HostedCost("async", hosted.kernel, replace(hosted.host, async_scheduling=True))
    prefill_step = hosted.step_ms(BatchShape(1, 512, 0, batch, batch * 1024)) \
        - kernels.step_ms(BatchShape(1, 512, 0, batch, batch * 1024))
    print(f"\ninference-sim sim-to-real (H100, vLLM 0.15.1): decode batch {batch} "
          f"(where kernels give {public.SIM_TO_REAL_KERNEL_ITL_MS} ms)")
    print(f"ITL measured {public.SIM_TO_REAL_ITL_MS[0]}-{public.SIM_TO_REAL_ITL_MS[1]} ms: "
          f"kernels+host {_err(hosted.step_ms(itl_shape), itl_mid)}, async scheduling "
          f"{_err(asynchronous.step_ms(itl_shape), itl_mid)}, kernels "
          f"{_err(kernels.step_ms(itl_shape), itl_mid)}")
    ttft = public.SIM_TO_REAL_KERNEL_TTFT_MS + prefill_step + hosted.host.frontend_request_ms
    print(f"TTFT measured {public.SIM_TO_REAL_TTFT_MS[0]}-{public.SIM_TO_REAL_TTFT_MS[1]} ms: "
          f"kernel-only {public.SIM_TO_REAL_KERNEL_TTFT_MS} + host {prefill_step:.1f} + front "
          f"end {hosted.host.frontend_request_ms:.1f} = {_err(ttft, ttft_mid)} (in sample)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
