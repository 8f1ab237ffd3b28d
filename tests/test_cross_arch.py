"""The C op test (tests/c/op_reference.c) against the stored scalar-level outputs, here and on aarch64.

tests/c/op_reference.bin holds the raw outputs of a fixed set of ops (mul_mat of every weight type at 1, 9 and
17 tokens (17: the amx level's tiles and a token tail), get_rows, rms/layer norm, rope, softmax, SiLU/GELU/ReLU,
attention over an f16 cache, the sparse FFN, input-sparse products over the Q4_0/Q4_K/Q6_K column layouts, inputs
whose quantized products fall on rounding ties, NaN inputs) on inputs the program makes from an integer PRNG, written
by the scalar level. Here the
program is compiled against the library Python loads and must reproduce those bytes at every ISA level
this CPU runs (the numeric contract, at C level). Then library and program are cross-compiled for
aarch64 (cmake/aarch64-linux-gnu.cmake, Debian's gcc-aarch64-linux-gnu) and run under qemu-aarch64:
there the one build has the scalar, neon, dotprod and i8mm levels (i8mm where the CPU has the int8 matrix multiply:
qemu's "max" model; a Cortex-A76 model has the Armv8.2 dot product only and runs dotprod; a Cortex-A57 model runs
neon), and each must give the same bits.

libm: softmax calls glibc's expf (the activations, the sparse FFN's too, and attention have their own exp),
rope calls pow/sin/cos. The cases here are bit-exact on aarch64, with one exception, kept on purpose and named in
LIBM_ULPS: glibc 2.36's expf rounds one input of [-104, 0), x = -63.09946 (0xc27c65d9), 1 ulp differently
on x86-64 with FMA (its __expf_fma variant: 0x11fa2993) than on aarch64 or x86-64 without FMA
(0x11fa2992, the correctly rounded value). Case softmax.libm_expf feeds exactly that input, so the stored
(x86 FMA) reference and an aarch64 run differ there by 1 ulp; everywhere else the comparison is exact, and
a failure names the case, how many values differ and by how many ulps. (pow/sin/cos agreed on every rope angle
for positions < 32768, n_rot 64/128, base 1e4/1e6.)

Regenerate the reference (only when an op's results are meant to change):
    python tests/test_cross_arch.py --regenerate
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import powerinfer as pi
from powerinfer import _ffi

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "c" / "op_reference.c"
REF = ROOT / "tests" / "c" / "op_reference.bin"
TOOLCHAIN = ROOT / "cmake" / "aarch64-linux-gnu.cmake"
SYSROOT = Path("/usr/aarch64-linux-gnu")
MAGIC = b"PIOPREF1"
# cases whose outputs depend on how the platform's libm rounds (see the module docstring): max ulps allowed
LIBM_ULPS = {"softmax.libm_expf": 1}


def read_cases(path: Path) -> dict[str, np.ndarray]:
    """OUT.bin of op_reference -> {case name: its float32 outputs as uint32 bit patterns}, in file order."""
    data = path.read_bytes()
    assert data[:8] == MAGIC, f"{path}: not an op_reference output"
    cases, off = {}, 8
    while off < len(data):
        n = int.from_bytes(data[off:off + 4], "little")
        name = data[off + 4:off + 4 + n].decode()
        off += 4 + n
        count = int.from_bytes(data[off:off + 4], "little")
        cases[name] = np.frombuffer(data, "<u4", count, off + 4).copy()
        off += 4 + 4 * count
    return cases


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 bit patterns (same-sign ordering)."""
    def ordered(u: np.ndarray) -> np.ndarray:
        s = u.astype(np.int64)
        return np.where(s & 0x80000000, 0x80000000 - s, s)
    return np.abs(ordered(a) - ordered(b))


def compare(got: dict[str, np.ndarray], where: str) -> dict[str, int]:
    """Every case bit for bit, except LIBM_ULPS's (within their ulps). Returns {case: max ulps} of those
    libm cases that were not exact."""
    ref = read_cases(REF)
    assert list(got) == list(ref), f"{where}: cases {list(got)} != reference {list(ref)}"
    bad, libm = [], {}
    for name, r in ref.items():
        g = got[name]
        if g.shape != r.shape:
            bad.append(f"{name}: {g.size} values, reference {r.size}")
        elif not np.array_equal(g, r):
            d = ulps(g, r)
            nan = np.isnan(g.view(np.float32)) != np.isnan(r.view(np.float32))
            if name in LIBM_ULPS and not nan.any() and d.max() <= LIBM_ULPS[name]:
                libm[name] = int(d.max())
                continue
            # (a -0 where the reference has +0 differs by 0 ulp: counted by bits)
            bad.append(f"{name}: {np.count_nonzero(g != r)} of {d.size} values differ, max {int(d.max())} ulp"
                       + (f", {int(nan.sum())} NaN mismatches" if nan.any() else "")
                       + (f" (libm tolerance {LIBM_ULPS[name]} ulp)" if name in LIBM_ULPS else ""))
    assert not bad, f"{where} differs from tests/c/op_reference.bin (scalar level):\n  " + "\n  ".join(bad)
    return libm


# The reference holds bf16 weights' f32-activation results (POWERINFER_BF16_DOT=0): the default on CPUs without
# AVX512_BF16, where a CPU with it computes them in vdpbf16ps's arithmetic (docs/design.md)
BF16_DOT = {"POWERINFER_BF16_DOT": "0"}


def run_program(cmd: list[str], out: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    env = {**(os.environ if env is None else env), **BF16_DOT}
    p = subprocess.run(cmd + [str(out)], capture_output=True, text=True, env=env, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


# ---- natively, against the library Python loads -------------------------------------------------

def build_native(out_dir: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc, gcc or clang) to build tests/c/op_reference.c")
    lib = _ffi._library_path()
    exe = out_dir / "op_reference"
    subprocess.run([cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'core' / 'include'}",
                    str(SRC), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm", "-o", str(exe)], check=True)
    return exe


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    return build_native(tmp_path_factory.mktemp("op_reference_native"))


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_native_level_reproduces_reference(native, level, tmp_path):
    if not pi.cpu_isa_supported(level):
        pytest.skip(f"{level}: not run by this CPU or build ({pi.system_info()})")
    stdout = run_program([str(native)], tmp_path / "out.bin", env={**os.environ, "POWERINFER_ISA": level})
    assert stdout.rstrip().endswith(f"isa {level}")
    compare(read_cases(tmp_path / "out.bin"), f"native {level}")


def test_native_one_thread(native, tmp_path):
    """The reference is written with 2 threads; 1 thread gives the same bits."""
    p = subprocess.run([str(native), str(tmp_path / "out.bin"), "1"], capture_output=True, text=True,
                       env={**os.environ, "POWERINFER_ISA": "scalar", **BF16_DOT}, timeout=300)
    assert p.returncode == 0, p.stderr
    compare(read_cases(tmp_path / "out.bin"), "native scalar, 1 thread")


# ---- older x86-64 CPUs, emulated: the level chosen and no illegal instruction ----------------------
# qemu-user's x86-64 emulator reports the cpuid/xgetbv of the CPU model it is given (its TCG has no
# AVX-512), so the one build must pick the scalar level on a CPU without AVX and avx2 on a Haswell, and
# give the reference bits on both (glibc's expf without FMA: the libm case's 1 ulp, see above).
X86_MODELS = {"Westmere": "scalar", "Haswell": "avx2", "Skylake-Server": "avx2"}   # -cpu model: expected level


@pytest.mark.parametrize("model", list(X86_MODELS))
def test_emulated_x86_cpu_picks_its_level(native, model, tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("x86-64 host only")
    qemu = shutil.which("qemu-x86_64") or shutil.which("qemu-x86_64-static")
    if not qemu:
        pytest.skip("qemu-x86_64 (apt-get install qemu-user) is needed to emulate older x86-64 CPUs")
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("an AddressSanitizer build does not run under qemu-user (its shadow memory mapping fails)")
    env = {k: v for k, v in os.environ.items() if k != "POWERINFER_ISA"}
    stdout = run_program([qemu, "-cpu", model, str(native)], tmp_path / "out.bin", env=env)
    assert stdout.rstrip().endswith(f"isa {X86_MODELS[model]}"), stdout[-200:]
    compare(read_cases(tmp_path / "out.bin"), f"qemu-x86_64 -cpu {model}")


# ---- aarch64: cross-compiled, run under qemu-user -------------------------------------------------

def aarch64_tools() -> tuple[str, str]:
    gcc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64") or shutil.which(
        "qemu-aarch64-static")
    missing = [what for what, ok in [
        ("aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)", gcc),
        ("the aarch64 C library (apt-get install libc6-dev-arm64-cross)", (SYSROOT / "lib" / "crt1.o").is_file()),
        ("qemu-aarch64 (apt-get install qemu-user)", qemu),
        ("cmake", shutil.which("cmake"))] if not ok]
    if missing:
        pytest.skip("aarch64 cross test: missing " + ", ".join(missing))
    return gcc, qemu


def find_clang() -> str | None:
    return shutil.which("clang") or next((c for v in range(20, 13, -1) if (c := shutil.which(f"clang-{v}"))), None)


# The cross build with GCC, and with clang (the compiler of Apple's machines, whose NEON intrinsics and __fp16 must
# build there too) where one is installed (apt-get install clang).
@pytest.fixture(scope="module", params=["gcc", "clang"])
def aarch64(request, tmp_path_factory) -> tuple[str, Path]:
    """(qemu, op_reference): the library and program cross-built with cmake/aarch64-linux-gnu.cmake."""
    _, qemu = aarch64_tools()
    compiler = []
    if request.param == "clang":
        clang = find_clang()
        if not clang:
            pytest.skip("aarch64 cross test with clang: no clang here (apt-get install clang)")
        compiler = [f"-DCMAKE_C_COMPILER={clang}", "-DCMAKE_C_COMPILER_TARGET=aarch64-linux-gnu"]
    build = tmp_path_factory.mktemp(f"build-aarch64-{request.param}")
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}", *compiler,
                    "-DPI_TESTS=ON", "-DPI_WERROR=ON", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    p = subprocess.run(["cmake", "--build", str(build), "-j", str(min(os.cpu_count() or 1, 4))],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"aarch64 cross build failed:\n{p.stdout}\n{p.stderr}"
    return qemu, build / "op_reference"


def qemu_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POWERINFER_ISA", "LD_PRELOAD")}   # (x86 ASan runtime)
    return {**env, "QEMU_LD_PREFIX": str(SYSROOT), **extra}


# qemu-aarch64's CPU models: "max" has the int8 matrix multiply (the i8mm level), a Cortex-A76 the Armv8.2 dot product
# but not SMMLA (dotprod: an SMMLA in its code would trap), a Cortex-A57 (Armv8.0, as the Cortex-A72 of a Raspberry
# Pi 4) neither, so there the one build runs the neon level, with SDOT emulated. Each level must give the reference
# bits.
AARCH64_MODELS = {"max": "i8mm", "cortex-a76": "dotprod", "cortex-a57": "neon"}   # -cpu model: the level it picks


@pytest.mark.parametrize("model", list(AARCH64_MODELS))
def test_aarch64_picks_its_level_and_reproduces_reference(aarch64, model, tmp_path):
    qemu, exe = aarch64
    stdout = run_program([qemu, "-cpu", model, str(exe)], tmp_path / "out.bin", env=qemu_env())
    assert stdout.rstrip().endswith(f"isa {AARCH64_MODELS[model]}"), stdout[-200:]
    got = read_cases(tmp_path / "out.bin")
    compare(got, f"aarch64 (qemu -cpu {model})")
    # aarch64's expf gives the correctly rounded exp(-63.09946) (module docstring)
    assert got["softmax.libm_expf"][1] == 0x11fa2992, hex(got["softmax.libm_expf"][1])


@pytest.mark.parametrize("level", ["scalar", "neon", "dotprod"])
def test_aarch64_lower_level_on_an_i8mm_cpu(aarch64, level, tmp_path):
    """POWERINFER_ISA=scalar, neon or dotprod on a CPU that runs i8mm: that level, the same bits."""
    qemu, exe = aarch64
    stdout = run_program([qemu, "-cpu", "max", str(exe)], tmp_path / "out.bin", env=qemu_env(POWERINFER_ISA=level))
    assert stdout.rstrip().endswith(f"isa {level}"), stdout[-200:]
    compare(read_cases(tmp_path / "out.bin"), f"aarch64 (qemu -cpu max, POWERINFER_ISA={level})")


@pytest.mark.parametrize("level, model, why", [("avx2", "max", "this build does not include it"),
                                               ("dotprod", "cortex-a57", "this CPU does not support it"),
                                               ("i8mm", "cortex-a76", "this CPU does not support it")])
def test_aarch64_refuses_a_level_it_cannot_run(aarch64, level, model, why, tmp_path):
    qemu, exe = aarch64
    p = subprocess.run([qemu, "-cpu", model, str(exe), str(tmp_path / "out.bin")], capture_output=True, text=True,
                       env=qemu_env(POWERINFER_ISA=level), timeout=60)
    assert p.returncode == 1 and why in p.stderr, (p.returncode, p.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        exe = build_native(Path(d))
        print(run_program([str(exe)], REF, env={**os.environ, "POWERINFER_ISA": "scalar"}), end="")
    print(f"wrote {REF}")
