"""python -m powerinfer.gpu_split: the original's invocation (spec 2) and a friendlier one::

    python -m powerinfer.gpu_split --activation DIR --layer N --neuron N_FF --capacity NEURONS \\
        --vram-capacity BYTES --output FILE [--batch 256] [--threshold 0]
    python -m powerinfer.gpu_split --model FILE --vram-budget GIB [-c N_CTX] [-b N_BATCH]
        [--memory-f32] [--activation DIR] [--reset-gpu-index] [--disable-gpu-index]
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from . import (GROUP, GpuSplitError, default_budget_bytes, ensure_gpu_index, gpuidx_path, hot_neurons,
               library_compute_bytes, load_activations, solve_greedy, solve_milp, write_gpuidx)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m powerinfer.gpu_split",
        description="Choose the hot FFN neurons that go to the GPU and write the .generated.gpuidx file.",
        epilog="Original form (what the C++ engine runs): --activation DIR --layer N --neuron N_FF "
               "--capacity NEURONS --vram-capacity BYTES --output FILE.  Friendly form: --model FILE "
               "--vram-budget GIB.")
    p.add_argument("--activation", help="directory of activation_N.pt files (default with --model: "
                   "<model dir>/activation)")
    p.add_argument("--layer", type=int, help="number of layers")
    p.add_argument("--neuron", type=int, help="FFN neurons per layer (n_ff)")
    p.add_argument("--capacity", type=int, help="hot neurons that fit on the GPU, over all layers")
    p.add_argument("--vram-capacity", type=int, help="VRAM bytes the split is for (stored in the file)")
    p.add_argument("--output", help="gpuidx file to write")
    p.add_argument("--batch", type=int, default=GROUP, help="neurons per group (default %(default)s)")
    p.add_argument("--threshold", type=int, default=0,
                   help="a layer gets no neurons or at least this many (default 0; > 0 needs scipy)")
    p.add_argument("--model", help="model file (.powerinfer.gguf)")
    p.add_argument("--vram-budget", type=float, help="GiB of VRAM to use (default: free VRAM - 256 MiB)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="KV cache size in tokens (default %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="tokens per decode call (default %(default)s)")
    p.add_argument("--memory-f32", action="store_true", help="f32 KV cache (default f16)")
    p.add_argument("--reset-gpu-index", action="store_true", help="regenerate the index file")
    p.add_argument("--disable-gpu-index", action="store_true", help="no hot FFN rows on the GPU")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(message)s")
    try:
        if a.model:
            if a.vram_budget is not None:
                if not a.vram_budget >= 0:
                    p.error("--vram-budget must be >= 0")
                budget, explicit = int(a.vram_budget * 2**30), True
            else:
                budget, explicit = default_budget_bytes(), False
                if budget is None:
                    print("error: no GPU found: give --vram-budget GIB to plan for one", file=sys.stderr)
                    return 1
            compute = library_compute_bytes(a.model, a.ctx_size, a.batch_size)
            plan, idx = ensure_gpu_index(a.model, budget, n_ctx=a.ctx_size, n_batch=a.batch_size,
                                         kv_type="f32" if a.memory_f32 else "f16", explicit=explicit,
                                         reset=a.reset_gpu_index, disable=a.disable_gpu_index,
                                         activation_dir=a.activation, compute_bytes=compute)
            print(plan.summary())
            if idx is not None:
                print(f"index: {gpuidx_path(a.model)}")
            return 0
        missing = [f"--{n.replace('_', '-')}" for n in ("activation", "layer", "neuron", "capacity",
                                                         "vram_capacity", "output") if getattr(a, n) is None]
        if missing:
            p.error(f"missing {', '.join(missing)} (or use --model FILE --vram-budget GIB)")
        if a.layer < 1 or a.neuron < 1 or a.capacity < 0 or a.vram_capacity < 0 or a.batch < 1:
            p.error("--layer, --neuron and --batch must be >= 1, --capacity and --vram-capacity >= 0")
        acts = load_activations(a.activation, a.layer, a.neuron)
        if a.threshold > 0:
            counts = solve_milp(acts, a.capacity, a.batch, a.threshold)
        else:
            counts = solve_greedy(acts, a.capacity, a.batch)
        write_gpuidx(a.output, [hot_neurons(x, c) for x, c in zip(acts, counts)], a.neuron, a.vram_capacity)
        print(f"{sum(counts)} of {a.layer * a.neuron} neurons hot (per layer {min(counts)}..{max(counts)}); "
              f"wrote {a.output}")
        return 0
    except GpuSplitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
