"""Rope scaling as llama.cpp resolves it: the file's rope.scaling.* metadata, the --rope-* / --yarn-* overrides, and
YaRN expressed in what the C core already has.

YaRN (llama.cpp's rope with ext_factor != 0; ggml's rope_yarn) rotates pair i of a head by

    theta_i = (1 - r_i) * theta_interp + r_i * theta_extrap,   theta_extrap = pos * base^(-2i/n_rot) / ff_i,
    theta_interp = freq_scale * theta_extrap,  r_i = ext_factor * ramp(i),
    ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1),
    low, high = floor / ceil of n_rot * ln(n_ctx_orig / (beta * 2 pi)) / (2 ln base) for beta_fast / beta_slow,
                clamped to [0, n_rot - 1],

and multiplies cos and sin by mscale. The core rotates by theta_i = pos * freq_scale * base^(-2i/n_rot) / f_i with
per-pair frequency divisors f_i (a model's rope_freqs), so YaRN is f_i = ff_i / ((1 - r_i) + r_i / freq_scale);
and cos/sin are scaled by mscale in the core's rope too (hparams.rope_mscale: the rotated dims only, as ggml).
mscale (llama.cpp's llama_context setup): with ext_factor != 0, 1 + 0.1 ln(1 / freq_scale) for a factor > 1
(else 1), divided by 1 + 0.1 mscale_all_dim ln(1 / freq_scale) where the file has rope.scaling.yarn_log_multiplier
(mscale_all_dim; llama.cpp assumes mscale 1); without, the yarn attn factor (--yarn-attn-factor, 1); times the file's
rope.scaling.attn_factor.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["apply_overrides", "yarn_factors"]


def apply_overrides(hp, *, rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0, rope_scaling: str | None = None,
                    yarn_orig_ctx: int = 0, yarn_ext_factor: float = -1.0, yarn_attn_factor: float = -1.0,
                    yarn_beta_fast: float = -1.0, yarn_beta_slow: float = -1.0):
    """hp (an HParams) with llama.cpp's context rope settings applied: 0 / negative / None keep the file's.
    rope_scaling "none" never scales; a type given without ext_factor sets it (1 for yarn, else 0)."""
    for name, value in (("rope_freq_base", rope_freq_base), ("rope_freq_scale", rope_freq_scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0 (0: the file's), got {value!r}")
    for name, value in (("yarn_ext_factor", yarn_ext_factor), ("yarn_attn_factor", yarn_attn_factor),
                        ("yarn_beta_fast", yarn_beta_fast), ("yarn_beta_slow", yarn_beta_slow)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number (negative: the file's), got {value!r}")
    if isinstance(yarn_orig_ctx, bool) or not isinstance(yarn_orig_ctx, int) or yarn_orig_ctx < 0:
        raise ValueError(f"yarn_orig_ctx must be an integer >= 0 (0: the file's), got {yarn_orig_ctx!r}")
    if rope_scaling not in (None, "none", "linear", "yarn"):
        raise ValueError(f"rope_scaling must be none, linear or yarn, got {rope_scaling!r}")
    ch = {}
    if rope_freq_base:
        ch["rope_freq_base"] = float(rope_freq_base)
    if rope_freq_scale:
        ch["rope_freq_scale"] = float(rope_freq_scale)
    if rope_scaling is not None:
        ch["rope_scaling"] = rope_scaling
        ch["yarn_ext_factor"] = 1.0 if rope_scaling == "yarn" else 0.0
    if (rope_scaling or hp.rope_scaling) == "none":
        ch["rope_freq_scale"] = 1.0
    if yarn_ext_factor >= 0:
        ch["yarn_ext_factor"] = float(yarn_ext_factor)
    for name, value in (("yarn_attn_factor", yarn_attn_factor), ("yarn_beta_fast", yarn_beta_fast),
                        ("yarn_beta_slow", yarn_beta_slow)):
        if value >= 0:
            ch[name] = float(value)
    if yarn_orig_ctx:
        ch["yarn_orig_ctx"] = int(yarn_orig_ctx)
    hp = dataclasses.replace(hp, **ch) if ch else hp
    if hp.arch in ("gemma2", "gemma3") and (hp.yarn_ext_factor != 0.0 or rope_mscale(hp) != 1.0):
        raise ValueError(f"YaRN / a rope attention factor is not supported for {hp.arch} (its local layers rope apart)")
    if hp.n_swa and hp.yarn_ext_factor != 0.0 and (hp.rope_freq_base_swa not in (0.0, hp.rope_freq_base) or
                                                   hp.rope_freq_scale_swa not in (0.0, hp.rope_freq_scale)):
        # the core's YaRN is one set of per-pair divisors (yarn_factors, of the global base and scale) for every layer
        raise ValueError(f"YaRN with a local-layer rope (base {hp.rope_freq_base_swa}, scale {hp.rope_freq_scale_swa}) "
                         f"other than the global one (base {hp.rope_freq_base}, scale {hp.rope_freq_scale}) is not "
                         f"supported for {hp.arch} (a --rope-freq-base / --rope-freq-scale override changes the global "
                         "layers only, as llama.cpp)")
    return hp


def _yarn_attn_factor(hp) -> float:
    """llama.cpp's cparams.yarn_attn_factor (llama_context's setup): with YaRN get_mscale(factor, m) /
    get_mscale(factor, m_all) / (1 + 0.1 ln factor), m_all the file's yarn_log_mul (YaRN's mscale_all_dim) and m 1
    (deepseek2 with m_all != 1: m_all, llama.cpp's special case), or get_mscale(factor, 1) / (1 + 0.1 ln factor)
    without it; times rope.scaling.attn_factor."""
    if hp.yarn_ext_factor == 0.0:
        return hp.yarn_attn_factor * hp.rope_attn_factor
    factor = 1.0 / hp.rope_freq_scale

    def get_mscale(m: float) -> float:
        return 1.0 if factor <= 1.0 else 1.0 + 0.1 * m * math.log(factor)
    m_all = hp.yarn_log_mul
    if m_all:
        ratio = get_mscale(m_all if hp.arch == "deepseek2" and m_all != 1.0 else 1.0) / get_mscale(m_all)
    else:
        ratio = get_mscale(1.0)
    return ratio / (1.0 + 0.1 * math.log(factor)) * hp.rope_attn_factor


def rope_mscale(hp) -> float:
    """The factor llama.cpp multiplies cos and sin by: its yarn_attn_factor, times 1 + 0.1 ln(1 / freq_scale) in
    ggml's rope with YaRN."""
    if hp.yarn_ext_factor == 0.0:
        return _yarn_attn_factor(hp)
    return _yarn_attn_factor(hp) * (1.0 + 0.1 * math.log(1.0 / hp.rope_freq_scale))


def mla_attn_scale(hp) -> float:
    """deepseek2's attention scale (llama.cpp's deepseek2 graph): mscale^2 / sqrt(mla_head_k), mscale = the rope's
    attn_factor with ggml's YaRN factor taken back out, times 1 + 0.1 yarn_log_mul ln(1 / freq_scale)."""
    log_scale = math.log(1.0 / hp.rope_freq_scale)
    mscale = _yarn_attn_factor(hp) * (1.0 + 0.1 * log_scale) * (1.0 + 0.1 * hp.yarn_log_mul * log_scale)
    return mscale * mscale / math.sqrt(hp.mla_head_k)


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """ggml's correction range: the pair indices where YaRN blends from extrapolation to interpolation."""
    def corr(beta):
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr(beta_fast))), min(n_rot - 1.0, math.ceil(corr(beta_slow)))


def yarn_factors(hp, file_factors: np.ndarray | None) -> np.ndarray | None:
    """The per-pair frequency divisors f [n_rot/2] float32 for the core, or None when YaRN's ramp is off and the
    file has none (the cos / sin scale is rope_mscale: the core's hparams.rope_mscale)."""
    if hp.yarn_ext_factor == 0.0:
        return file_factors
    half = hp.n_rot // 2
    low, high = yarn_corr_dims(hp.n_rot, hp.yarn_orig_ctx or hp.n_ctx_train, hp.rope_freq_base, hp.yarn_beta_fast,
                               hp.yarn_beta_slow)
    i = np.arange(half, dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)                  # [half]
    r = hp.yarn_ext_factor * ramp
    ff = np.ones(half) if file_factors is None else np.asarray(file_factors, dtype=np.float64)
    return (ff / ((1.0 - r) + r / hp.rope_freq_scale)).astype(np.float32)
