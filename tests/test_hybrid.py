"""The hybrid CPU/GPU forward pass on the emulated device (issue 14), in every CI run.

POWERINFER_EMULATED_GPU_MIB=N makes libpowerinfer report one device of N MiB whose memory is counted
host memory and whose ops are the CPU kernels: placement, uploads, the hot/cold split, budget checks
and logs are the code a CUDA build runs. The library reads the variable once, and with a device
every Context offloads by default, so the tests run in a child pytest with the variable set (one
process); run this file with the variable set to see them one by one.

Tolerances:
* all-CPU, all-hot layers and dense -ngl: logits bit-identical to the CPU-only run. Those layers
  sum in the CPU's order; dense weights on the device are the file's layout, which mul_mat's
  canonical order makes bit-identical to the repacked CPU copies.
* layers split hot/cold: each output is (sum over cold neurons) + (sum over hot ones) instead of
  one sum in range order, a different float summation order; and in a q4_0 file with n_embd % 256
  == 0 the CPU reads packed Q4_0R rows (another dot-product order, powerinfer.h) while the device
  reads the file's Q4_0. Each sum then differs by a few float32 ulps, and the differences grow through
  the layers and the KV cache of 20 positions: logits agree to rtol = atol = HYBRID_TOL (measured:
  at most 1e-4 absolute, 3e-5 relative, on logits of magnitude ~10) and greedy tokens are equal.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import torch_free_save

ENV = "POWERINFER_EMULATED_GPU_MIB"
REPO = Path(__file__).resolve().parents[1]
HYBRID_TOL = 2e-4
# Packed Q4_0R rows on the CPU add their down_t rows in integer groups (arch/q4_0r.c axpy_group: 14-bit
# coefficients, 1e-4 of an FFN output), the device the file's rows by f32 axpy. This planted random model is
# sensitive: the CPU alone with the f32 axpy (before the groups) and with the groups differs by 1.4e-3 .. 7e-3 per
# token and by 0.14 on one token (a predictor decision near its threshold), and greedy continuations can part, so
# the hybrid runs are fed the CPU's tokens. Measured, the logits' relative RMS difference (printed with -s):
# 6.0e-4 with a quarter of the neurons hot, 4.4e-2 with half, 3.9e-2 with all.
PACKED_HYBRID_TOL = 0.1

if not os.environ.get(ENV):
    def test_hybrid_suite_on_the_emulated_device():
        env = {**os.environ, ENV: "1024"}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
else:
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tools"))
    sys.path.insert(0, str(REPO / "bench"))
    import powerinfer as pi
    from helpers import rel_rms
    from powerinfer import gpu_split as gs
    from powerinfer._ffi import ffi, lib

    PROMPT = [1, 17, 200, 45, 3, 99, 128, 7]

    def greedy(ctx, n=12, prompt=PROMPT, forced=None):
        """The greedy continuation's tokens and logits; with forced, those tokens are fed instead (teacher forcing)."""
        ctx.decode(prompt)
        out, logits = [], []
        for i in range(n):
            lg = ctx.logits(-1)
            logits.append(lg)
            out.append(int(np.argmax(lg)))
            ctx.decode([out[-1] if forced is None else forced[i]])
        return out, np.array(logits)

    def with_acts(tmp: Path, src: Path, act_dir: Path | None = None) -> Path:
        tmp.mkdir(parents=True, exist_ok=True)
        dst = tmp / "m.powerinfer.gguf"
        shutil.copy(src, dst)
        if act_dir is not None:
            shutil.copytree(act_dir, tmp / "activation")
        return dst

    def write_acts(d: Path, n_layer: int, n_ff: int, seed: int = 0) -> None:
        (d / "activation").mkdir(exist_ok=True)
        rng = np.random.default_rng(seed)
        for i in range(n_layer):   # torch.save's format, written without torch (not in the test extras)
            torch_free_save(d / "activation" / f"activation_{i}.pt", rng.pareto(1.5, n_ff).astype(np.float32))

    @pytest.fixture(scope="module")
    def tinyrelu(tmp_path_factory):
        src = REPO / "models" / "tinyrelu"
        return with_acts(tmp_path_factory.mktemp("tiny"), src / "tinyrelu.powerinfer.gguf", src / "activation")

    @pytest.fixture(scope="module")
    def tinyrelu_q4(tmp_path_factory):
        src = REPO / "models" / "tinyrelu"
        return with_acts(tmp_path_factory.mktemp("tinyq4"), src / "tinyrelu.q4_0.powerinfer.gguf", src / "activation")

    @pytest.fixture(scope="module")
    def sparse7b_small(tmp_path_factory):
        """bench/make_sparse_model.py's 7B-shaped generator at a reduced shape (q4_0, n_embd 256: packed rows)."""
        from make_sparse_model import write_models
        d = tmp_path_factory.mktemp("s7b")
        path = d / "m.powerinfer.gguf"
        write_models(path, dense_out=d / "dense.gguf", dtype="q4_0", n_vocab=320, n_embd=256, n_ff=704, n_head=4,
                     n_head_kv=4, n_layer=2, n_ctx_train=512, rank=96, log=lambda *a, **k: None)
        write_acts(d, 2, 704)
        return path

    @pytest.fixture(scope="module")
    def dense_llama(tmp_path_factory):
        from make_test_model import write_model
        path = tmp_path_factory.mktemp("dense") / "llama-q4_0.gguf"
        write_model(path, dtype="q4_0", n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=3)
        return path

    def budgets(path: Path, model, n_ctx: int):
        """0, the dense part + about 0, a quarter, a half and all of the FFN."""
        info = gs.ModelInfo.from_gguf(path)
        comp = lib.pi_offload_compute_bytes(model._ptr, 0, n_ctx, n_ctx)
        plan = gs.plan_budget(info, 1 << 50, n_ctx=n_ctx, n_batch=n_ctx, compute_bytes=comp)
        groups = -(-info.n_ff // gs.GROUP) * gs.GROUP   # a layer's last, shorter group costs a whole one
        all_ffn = info.n_layer * (groups * plan.neuron_bytes + 4 * gs.ALIGN)
        return [0] + [plan.dense_bytes + int(all_ffn * f) for f in (0.0, 0.25, 0.5, 1.0)]

    @pytest.mark.parametrize("which", ["tinyrelu", "tinyrelu_q4", "sparse7b_small"])
    def test_sparse_hybrid_equals_cpu(which, request):
        path = request.getfixturevalue(which)
        model = pi.Model(path)
        if which == "sparse7b_small":   # the CPU reads packed Q4_0R rows, the device the file's Q4_0
            assert lib.pi_model_n_packed_ffn(model._ptr) == model.hparams.n_layer
        cpu_tokens, cpu_logits = greedy(pi.Context(model, n_ctx=64, vram_budget=0))
        n_ff, n_layer = model.hparams.n_ff, model.hparams.n_layer
        packed = which == "sparse7b_small"
        seen = set()
        for budget in budgets(path, model, 64):
            ctx = pi.Context(model, n_ctx=64, vram_budget=budget, reset_gpu_index=True)
            tokens, logits = greedy(ctx, forced=cpu_tokens if packed else None)
            if not packed:
                assert tokens == cpu_tokens, f"budget {budget}"
            st = ctx.offload
            if st is None or st.n_hot == 0 or (st.n_hot == n_layer * n_ff and not packed):
                np.testing.assert_array_equal(logits, cpu_logits, err_msg=f"budget {budget}")   # the CPU's order
            elif packed:
                err = rel_rms(logits, cpu_logits)
                print(f"budget {budget}: hot {st.n_hot}, logits rel. RMS {err:.2e}")
                assert err < PACKED_HYBRID_TOL, f"budget {budget}"
            else:
                np.testing.assert_allclose(logits, cpu_logits, rtol=HYBRID_TOL, atol=HYBRID_TOL,
                                           err_msg=f"budget {budget}")
            seen.add("cpu" if st is None else "all" if st.n_hot == n_layer * n_ff else "none" if st.n_hot == 0
                     else "split")
        assert seen == {"cpu", "none", "split", "all"}, seen

    def test_sparse_batch_and_prompt_paths(tinyrelu):
        """A multi-token batch (the batched gather/down path) and two sequences through a split placement."""
        model = pi.Model(tinyrelu)
        b = budgets(tinyrelu, model, 64)[3]
        ref = pi.Context(model, n_ctx=64, n_seq_max=2, vram_budget=0, count_neurons=True)
        hyb = pi.Context(model, n_ctx=64, n_seq_max=2, vram_budget=b, count_neurons=True)
        assert 0 < hyb.offload.n_hot < model.hparams.n_layer * model.hparams.n_ff
        for c in (ref, hyb):
            c.decode(PROMPT, logits="all")
            c.kv_seq_cp(0, 1)
            c.decode([5, 6], pos=[len(PROMPT)] * 2, seq_id=[0, 1], logits="all")
        for i in range(2):
            np.testing.assert_allclose(hyb.logits(i), ref.logits(i), rtol=HYBRID_TOL, atol=HYBRID_TOL)
        a_ref, t_ref = ref.sparse_stats()
        a_hyb, t_hyb = hyb.sparse_stats()
        assert t_ref == t_hyb and np.array_equal(a_ref, a_hyb)   # each (neuron, token) pair counted once
        np.testing.assert_array_equal(hyb.neuron_counts(), ref.neuron_counts())   # hot ones by their file index

    def test_dense_ngl_equals_cpu(dense_llama):
        model = pi.Model(dense_llama)
        cpu_tokens, cpu_logits = greedy(pi.Context(model, n_ctx=64))
        n_layer = model.hparams.n_layer
        for ngl in list(range(n_layer + 2)) + [-1, 99]:
            ctx = pi.Context(model, n_ctx=64, n_gpu_layers=ngl)
            tokens, logits = greedy(ctx)
            assert tokens == cpu_tokens, f"-ngl {ngl}"
            np.testing.assert_array_equal(logits, cpu_logits, err_msg=f"-ngl {ngl}")
            st = ctx.offload
            if ngl == 0:
                assert st is None
            else:
                assert st.n_attn_layers == min(n_layer, ngl if ngl >= 0 else n_layer)
                assert st.output == (ngl < 0 or ngl > n_layer)

    @pytest.mark.parametrize("kv_type", ["q8_0", ("q4_0", "bf16")], ids=str)
    def test_dense_ngl_quantized_cache_equals_cpu(dense_llama, kv_type):
        """A quantized KV cache (-ctk / -ctv) on the emulated device: the layers' caches there in their types (the
        device's KV bytes those of the types), the CPU run's bits. A CUDA device refuses these types by name
        (supports_op PI_BOP_KV_CACHE: its attention reads f16 and f32 caches)."""
        model = pi.Model(dense_llama)
        cpu_tokens, cpu_logits = greedy(pi.Context(model, n_ctx=64, kv_type=kv_type))
        ctx = pi.Context(model, n_ctx=64, n_gpu_layers=2, kv_type=kv_type)
        tokens, logits = greedy(ctx)
        assert tokens == cpu_tokens
        np.testing.assert_array_equal(logits, cpu_logits)
        k_bytes, v_bytes = ctx.kv_cache_bytes   # every layer's; the device holds 2 of 3, each padded to ALIGN
        assert ctx.offload.n_attn_layers == 2
        per_layer = (k_bytes + v_bytes) // model.hparams.n_layer
        assert per_layer <= ctx.offload.kv_bytes / 2 < per_layer + 2 * gs.ALIGN

    def test_dense_ngl_last_row_equals_all_rows(dense_llama):
        """The last layer's FFN over the output rows only (context.c prune_last_ffn) with the layers on the device
        (the output too), or every layer but the last there (the residual stream moves back before it): the logits of
        a decode that computes every row through the last layer."""
        model = pi.Model(dense_llama)
        for ngl in (model.hparams.n_layer - 1, -1):
            full, last = (pi.Context(model, n_ctx=64, n_gpu_layers=ngl) for _ in range(2))
            full.decode(PROMPT, logits="all")
            last.decode(PROMPT, logits="last")
            np.testing.assert_array_equal(last.logits(-1), full.logits(len(PROMPT) - 1), err_msg=f"-ngl {ngl}")

    @pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma2", "gemma3"])
    def test_dense_ngl_other_architectures(tmp_path, arch):
        """-ngl with the other architectures' tensors on the device (qwen2's q/k/v biases, qwen3's and gemma3's
        q/k norms, gemma3's post norms beside its local layers, gemma2's soft-capped attention through the device's
        attention op and its capped logits from the device's head): bit-identical to the CPU, as for llama."""
        from model_files import write_arch_model
        path = tmp_path / f"{arch}.gguf"
        write_arch_model(path, arch, seed=2, dtype="q4_0")
        model = pi.Model(path)
        cpu_tokens, cpu_logits = greedy(pi.Context(model, n_ctx=64))
        for ngl in (1, -1):
            ctx = pi.Context(model, n_ctx=64, n_gpu_layers=ngl)
            assert ctx.offload is not None and ctx.offload.n_attn_layers == (1 if ngl == 1 else model.hparams.n_layer)
            tokens, logits = greedy(ctx)
            assert tokens == cpu_tokens, f"-ngl {ngl}"
            np.testing.assert_array_equal(logits, cpu_logits, err_msg=f"-ngl {ngl}")

    def test_adapters_and_control_vectors_on_offloaded_layers_are_refused(dense_llama, tmp_path):
        """LoRA terms and control vectors run on the CPU: an offloaded layer they touch is refused with the reason (at
        set time), the CPU layers keep them (the last layer on the device
        with -ngl 1)."""
        from model_files import write_control_vector, write_lora

        from powerinfer.control_vector import load_control_vectors
        from powerinfer.lora import LoraAdapter
        model = pi.Model(dense_llama)
        write_lora(tmp_path / "all.gguf", dense_llama, targets=("attn_q", "attn_v"), rank=4)
        write_lora(tmp_path / "out.gguf", dense_llama, targets=("output",), rank=4)
        every = LoraAdapter(tmp_path / "all.gguf", model)
        ctx = pi.Context(model, n_ctx=64, n_gpu_layers=1)                 # the last of 3 layers on the device
        with pytest.raises(pi.PowerInferError, match="layer 2, which adapter 0 adapts, is offloaded"):
            ctx.set_lora([(every, 1.0)])
        ctx.set_lora([(LoraAdapter(tmp_path / "out.gguf", model), 1.0)])    # the output head stays on the CPU
        ctx.decode(PROMPT)
        full = pi.Context(model, n_ctx=64, n_gpu_layers=-1)
        with pytest.raises(pi.PowerInferError, match="output head, which adapter 0 adapts, is offloaded"):
            full.set_lora([(LoraAdapter(tmp_path / "out.gguf", model), 1.0)])
        write_control_vector(tmp_path / "cv.gguf", model.hparams.n_embd, [1, 2])
        data = load_control_vectors(model, [(tmp_path / "cv.gguf", 1.0)])
        with pytest.raises(pi.PowerInferError, match="layer 2 is offloaded"):
            ctx.set_control_vector(data)
        ctx.set_control_vector(data, 1, 1)                                  # layer 1: on the CPU
        ctx.kv_clear()
        ctx.decode(PROMPT)

    def test_moe_ngl_places_the_attention_and_keeps_the_experts_on_the_cpu(tmp_path):
        """A mixture of experts with -ngl: the attention (and the head) on the device, the experts on the CPU; the
        CPU run's bits."""
        from test_moe import PROMPT as MOE_PROMPT
        from test_moe import write_moe
        model = pi.Model(write_moe(tmp_path, "llama"))
        cpu = pi.Context(model, n_ctx=64)
        cpu.decode(MOE_PROMPT, logits="all")
        gpu = pi.Context(model, n_ctx=64, n_gpu_layers=-1)
        assert gpu.offload.n_attn_layers == model.hparams.n_layer and gpu.offload.n_ffn_layers == 0
        assert any("experts run on the CPU" in w for w in gpu.gpu_warnings)
        gpu.decode(MOE_PROMPT, logits="all")
        for i in range(len(MOE_PROMPT)):
            np.testing.assert_array_equal(gpu.logits(i), cpu.logits(i))

    def test_gptoss_ngl_places_the_attention_with_its_sinks(tmp_path):
        """gpt-oss with -ngl: the attention (q/k/v and output biases, the sinks, the local layers' window) and the head
        on the device, the biased experts on the CPU; the CPU run's bits, prompt and one token at a time."""
        from model_files import write_arch_model
        from test_gptoss import PROMPT as GPTOSS_PROMPT
        path = tmp_path / "gptoss.gguf"
        write_arch_model(path, "gpt-oss", seed=3)
        model = pi.Model(path)
        cpu = pi.Context(model, n_ctx=64, kv_type="f32")
        gpu = pi.Context(model, n_ctx=64, kv_type="f32", n_gpu_layers=-1)
        assert gpu.offload.n_attn_layers == model.hparams.n_layer and gpu.offload.n_ffn_layers == 0
        assert any("experts run on the CPU" in w for w in gpu.gpu_warnings)
        for ctx in (cpu, gpu):
            ctx.decode(GPTOSS_PROMPT, logits="all")
        for i in range(len(GPTOSS_PROMPT)):
            np.testing.assert_array_equal(gpu.logits(i), cpu.logits(i))
        for t in (5, 9, 200):
            cpu.decode([t])
            gpu.decode([t])
            np.testing.assert_array_equal(gpu.logits(), cpu.logits())

    def test_api_n_gpu_layers_reaches_the_device(dense_llama):
        """PowerInfer(n_gpu_layers=) (llama-cpp-python's keyword) places layers as Context(-ngl) does."""
        cpu = pi.PowerInfer(dense_llama, n_ctx=64, n_threads=1, verbose=False)
        gpu = pi.PowerInfer(dense_llama, n_ctx=64, n_threads=1, n_gpu_layers=-1, verbose=False)
        assert cpu.ctx.offload is None
        assert gpu.ctx.offload.n_attn_layers == gpu.model.hparams.n_layer and gpu.ctx.offload.output
        assert lib.pi_device_allocated_bytes() > 0
        a = cpu.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert gpu.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"] == a
        gpu.close()
        cpu.close()

    def test_peak_device_memory_under_budget(sparse7b_small):
        model = pi.Model(sparse7b_small)
        b = budgets(sparse7b_small, model, 128)
        base = lib.pi_device_allocated_bytes()
        for budget in np.linspace(b[1] - 4096, b[-1] + (1 << 20), 9).astype(int):
            lib.pi_device_reset_peak()
            ctx = pi.Context(model, n_ctx=128, vram_budget=int(budget))
            greedy(ctx, n=4, prompt=PROMPT * 4)
            peak = lib.pi_device_peak_bytes() - base
            assert peak <= budget, (budget, peak)
            if ctx.offload is not None:
                assert ctx.offload.total_bytes <= budget and ctx.offload.total_bytes <= ctx.gpu_plan.used_bytes
                assert lib.pi_device_allocated_bytes() - base == ctx.offload.total_bytes
            del ctx
            assert lib.pi_device_allocated_bytes() == base   # everything freed with the context

    def test_hot_neurons_are_the_index(tinyrelu):
        model = pi.Model(tinyrelu)
        b = budgets(tinyrelu, model, 64)[3]
        ctx = pi.Context(model, n_ctx=64, vram_budget=b, reset_gpu_index=True)
        idx = gs.read_gpuidx(gs.gpuidx_path(tinyrelu))
        assert ctx.gpu_index is not None and sum(idx.hot_counts) == ctx.offload.n_hot > 0
        for il in range(model.hparams.n_layer):
            ids = ffi.new("int32_t[]", model.hparams.n_ff)
            n = lib.pi_context_hot_neurons(ctx._ptr, il, ids)
            assert n == len(idx.buckets[il])
            np.testing.assert_array_equal(np.frombuffer(ffi.buffer(ids, 4 * n), np.int32), idx.buckets[il])

    def test_reset_stale_and_broken_index(tinyrelu, caplog):
        model = pi.Model(tinyrelu)
        b = budgets(tinyrelu, model, 64)
        path = gs.gpuidx_path(tinyrelu)
        pi.Context(model, n_ctx=64, vram_budget=b[3], reset_gpu_index=True)
        first = path.stat().st_mtime_ns
        pi.Context(model, n_ctx=64, vram_budget=b[3])                       # same budget: reused
        assert path.stat().st_mtime_ns == first
        pi.Context(model, n_ctx=64, vram_budget=b[3], reset_gpu_index=True)  # --reset-gpu-index
        second = path.stat().st_mtime_ns
        assert second != first
        ctx = pi.Context(model, n_ctx=64, vram_budget=b[4])                 # other budget: stale
        assert path.stat().st_mtime_ns != second and ctx.offload.n_hot == sum(gs.read_gpuidx(path).hot_counts)
        os.utime(tinyrelu)                                                    # "other model": new mtime
        before = path.stat().st_mtime_ns
        pi.Context(model, n_ctx=64, vram_budget=b[4])
        assert path.stat().st_mtime_ns != before
        for junk in (b"", b"PWRI\x03\x00\x00\x00garbage", path.read_bytes()[:100]):
            path.write_bytes(junk)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="powerinfer"):
                ctx = pi.Context(model, n_ctx=64, vram_budget=b[3])
            assert ctx.offload is not None and ctx.offload.n_hot > 0
            assert any("regenerating" in r.getMessage() for r in caplog.records)
            gs.read_gpuidx(path)                                              # rewritten, readable
        ctx = pi.Context(model, n_ctx=64, vram_budget=b[3], disable_gpu_index=True)
        assert ctx.offload.n_hot == 0 and ctx.offload.n_attn_layers == model.hparams.n_layer

    def test_no_activation_files_runs_ffn_on_cpu(tmp_path):
        src = REPO / "models" / "tinyrelu" / "tinyrelu.powerinfer.gguf"
        path = with_acts(tmp_path, src)
        model = pi.Model(path)
        ctx = pi.Context(model, n_ctx=64, vram_budget=budgets(path, model, 64)[4])
        assert ctx.offload.n_hot == 0 and any("activation" in w for w in ctx.gpu_warnings)

    def test_budget_too_small_one_warning(tinyrelu, caplog):
        model = pi.Model(tinyrelu)
        with caplog.at_level(logging.WARNING, logger="powerinfer"):
            ctx = pi.Context(model, n_ctx=64, vram_budget=1 << 20)
        assert ctx.offload is None and len(ctx.gpu_warnings) == 1 and "cannot hold" in ctx.gpu_warnings[0]
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1

    def test_flags_that_do_not_apply_warn(tinyrelu, dense_llama):
        ctx = pi.Context(pi.Model(tinyrelu), n_ctx=64, vram_budget=0, n_gpu_layers=3)
        assert any("ignores n_gpu_layers" in w for w in ctx.gpu_warnings)
        ctx = pi.Context(pi.Model(dense_llama), n_ctx=64, vram_budget=1 << 30)
        assert ctx.offload is None and any("n_gpu_layers" in w for w in ctx.gpu_warnings)
        with pytest.raises(ValueError, match="n_gpu_layers"):
            pi.Context(pi.Model(dense_llama), n_ctx=64, n_gpu_layers=-2)
        with pytest.raises(ValueError, match="vram_budget"):
            pi.Context(pi.Model(tinyrelu), n_ctx=64, vram_budget=-1)

    def test_budget_above_free_memory_is_clamped(tinyrelu):
        ctx = pi.Context(pi.Model(tinyrelu), n_ctx=64, vram_budget=1 << 40)
        assert ctx.offload is not None and any("more than the device has free" in w for w in ctx.gpu_warnings)
        assert ctx.gpu_plan.budget_bytes <= (int(os.environ[ENV]) << 20) - gs.DEFAULT_MARGIN

    def test_default_budget_offloads(tinyrelu):
        """No vram_budget: free device memory minus 256 MiB (the original's default)."""
        ctx = pi.Context(pi.Model(tinyrelu), n_ctx=64)
        assert ctx.offload is not None and ctx.offload.n_hot == ctx.model.hparams.n_layer * ctx.model.hparams.n_ff

    def test_budget_checked_before_allocating(dense_llama):
        """pi_context_offload counts every byte first: a placement over its budget fails, allocates nothing
        and leaves the context usable on the CPU; one past the device's capacity fails the same way."""
        model = pi.Model(dense_llama)
        n_layer = model.hparams.n_layer
        arr = ffi.new("pi_layer_placement[]", n_layer)
        for i in range(n_layer):
            arr[i].attn = arr[i].ffn = lib.PI_PLACE_DEVICE
        p = ffi.new("pi_offload_params *")
        p.n_layer, p.layers, p.budget_bytes = n_layer, arr, 4096
        ctx = pi.Context(model, n_ctx=64)
        base = lib.pi_device_allocated_bytes()
        assert lib.pi_context_offload(ctx._ptr, p) == lib.PI_ERR_OUT_OF_MEMORY
        assert "budget" in ffi.string(lib.pi_last_error()).decode()
        assert lib.pi_device_allocated_bytes() == base
        if int(os.environ[ENV]) <= 1024:
            big = pi.Context(model, n_ctx=1 << 20, n_batch=512)     # KV cache + masks past a 1 GiB device
            p.budget_bytes = 0
            assert lib.pi_context_offload(big._ptr, p) == lib.PI_ERR_OUT_OF_MEMORY
            assert "emulated GPU" in ffi.string(lib.pi_last_error()).decode()
            assert lib.pi_device_allocated_bytes() == base
        assert greedy(ctx, n=2)[0] == greedy(pi.Context(model, n_ctx=64), n=2)[0]
        p.budget_bytes = 0
        assert lib.pi_context_offload(ctx._ptr, p) == lib.PI_ERR_INVALID_ARG   # after a decode
        assert "before the first decode" in ffi.string(lib.pi_last_error()).decode()

    def test_system_info_names_the_device():
        assert "emulated" in pi.system_info()

    def test_examples_log_the_placement(tinyrelu, dense_llama):
        main = str(REPO / "examples" / "main.py")
        common = ["-p", "Once upon a time", "-n", "4", "--temp", "0", "-c", "64"]
        b = budgets(tinyrelu, pi.Model(tinyrelu), 64)[3] / 2**30
        r = subprocess.run([sys.executable, main, "-m", str(tinyrelu), *common, "--vram-budget", f"{b:.6f}"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "llm_load_gpu_split: offloaded" in r.stderr and "VRAM used" in r.stderr and "hot" in r.stderr
        r = subprocess.run([sys.executable, main, "-m", str(dense_llama), *common, "-ngl", "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "offloading 2 repeating layers to GPU" in r.stderr and "offloaded 2/4 layers" in r.stderr

    def test_models_the_device_cannot_run_stay_on_cpu(tmp_path):
        """falcon/opt have no device path yet: one warning, the CPU runs them (never a failed Context)."""
        from test_sparse_archs import write_arch_model
        path = write_arch_model(tmp_path / "opt.powerinfer.gguf", "opt", ranks=(32, 32))
        write_acts(tmp_path, 2, 256)
        model = pi.Model(path)
        ctx = pi.Context(model, n_ctx=32, vram_budget=64 << 20)
        assert ctx.offload is None and any("CPU only" in w for w in ctx.gpu_warnings), ctx.gpu_warnings
        ref = pi.Context(model, n_ctx=32, vram_budget=0)
        assert greedy(ctx, n=3)[0] == greedy(ref, n=3)[0]

    def test_index_that_cannot_be_written(tinyrelu, tmp_path):
        """The index file cannot be read or written (here: a directory in its place, as a read-only model
        directory would): one warning, no hot neurons, the rest still offloaded; never a failed Context."""
        path = with_acts(tmp_path / "ro", tinyrelu, tinyrelu.parent / "activation")
        gs.gpuidx_path(path).mkdir()
        model = pi.Model(path)
        ctx = pi.Context(model, n_ctx=64, vram_budget=budgets(path, model, 64)[4])
        assert ctx.offload is not None and ctx.offload.n_hot == 0
        assert any("empty one will be used" in w for w in ctx.gpu_warnings), ctx.gpu_warnings
