#!/usr/bin/env python3
"""Guest instructions per op at the aarch64 levels (scalar, neon, dotprod, i8mm), counted under qemu-user: a proxy for the
NEON levels' speed where no Arm machine is at hand. Not a timing: an instruction count says nothing of latency, memory
bandwidth or how a core issues SDOT; it does say how much work each level's code asks the CPU to do.

The library and bench/qemu_count.c are cross-built for aarch64 (cmake/aarch64-linux-gnu.cmake), then each case runs
under `qemu-aarch64 -cpu max -singlestep -d nochain,exec` (one log line per executed guest instruction) with reps =
0 and reps = R; (lines(R) - lines(0)) / R is the op's count, setup excluded. One thread.

    python bench/qemu_instructions.py [--reps 1] [--build DIR]

Needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user (tests/test_cross_arch.py names them).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSROOT = "/usr/aarch64-linux-gnu"

LEVELS = ("scalar", "neon", "dotprod", "i8mm")
# (label, driver arguments without reps): one token per weight type, and a prompt's 8 tokens (one 8-row kernel call
# per 8 rows where the level has one; rows one by one otherwise, about 8 times one token's count)
CASES = [(f"mul_mat {t} 1024x256 t{n}", ["mul_mat", t, "1024", "256", str(n)])
         for n in (1, 8) for t in ("f16", "q8_0", "q4_0", "q5_0", "q4_K", "q5_K", "q6_K")]
CASES += [("attention f16 hd128 512 cells", ["attention", "128", "512"])]


def build(build_dir: Path) -> Path:
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_TOOLCHAIN_FILE={ROOT / 'cmake' / 'aarch64-linux-gnu.cmake'}"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", "2", "--target", "powerinfer"], check=True,
                   capture_output=True)
    exe = build_dir / "qemu_count"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-std=c11", f"-I{ROOT / 'core' / 'include'}",
                    str(ROOT / "bench" / "qemu_count.c"), str(build_dir / "libpowerinfer.so"),
                    "-Wl,-rpath," + str(build_dir), "-lm", "-o", str(exe)], check=True)
    return exe


def count(exe: Path, level: str, args: list[str]) -> tuple[int, str]:
    """(guest instructions executed, the driver's output line)"""
    env = {**os.environ, "QEMU_LD_PREFIX": SYSROOT, "POWERINFER_ISA": level}
    cmd = ["qemu-aarch64", "-cpu", "max", "-singlestep", "-d", "nochain,exec", "-D", "/dev/stderr", str(exe), *args]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = 0
    for chunk in iter(lambda: p.stderr.read(1 << 22), b""):
        lines += chunk.count(b"\nTrace ")
    out = p.stdout.read().decode().strip()
    if p.wait() != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}")
    return lines, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--build", type=Path, default=Path("/tmp/powerinfer-aarch64-count"))
    ap.add_argument("--only", default="", help="the cases whose label contains this")
    a = ap.parse_args()
    exe = build(a.build)
    print(f"{'case':34} " + " ".join(f"{lv:>12}" for lv in LEVELS) + "".join(f"  scalar/{lv}" for lv in LEVELS[1:]))
    for label, args in [c for c in CASES if a.only in c[0]]:
        per = {}
        for level in LEVELS:
            base, _ = count(exe, level, args + ["0"])
            total, out = count(exe, level, args + [str(a.reps)])
            assert out.startswith(level), out
            per[level] = (total - base) / a.reps
        print(f"{label:34} " + " ".join(f"{per[lv]:12,.0f}" for lv in LEVELS) +
              "".join(f"  {per['scalar'] / per[lv]:{len(lv) + 6}.2f}x" for lv in LEVELS[1:]), flush=True)


if __name__ == "__main__":
    main()
