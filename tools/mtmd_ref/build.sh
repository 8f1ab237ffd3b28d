#!/bin/sh
# Builds ./mtmd-ref (driver.cpp) from a llama.cpp source tree (default: the one vendored in llama-cpp-python's sdist,
# unpacked) against the installed llama-cpp-python's libllama / libggml: llama-cpp-python is built without mtmd
# (LLAVA_BUILD=OFF), so tools/mtmd's library sources are compiled here (CPU only), a test tool for the vision checks.
#   sh tools/mtmd_ref/build.sh [LLAMA_CPP_SRC] [OUT_DIR]
set -e
L=${1:-/tmp/lcp_src/llama_cpp_python-0.3.36/vendor/llama.cpp}
OUT=${2:-/tmp/mtmd_ref}
HERE=$(cd "$(dirname "$0")" && pwd)
LIB=$(python -c "import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'))")
M=$L/tools/mtmd
mkdir -p "$OUT/obj"
FLAGS="-std=c++17 -O2 -march=native -fPIC -I$M -I$L/include -I$L/ggml/include -I$L/vendor -I$L/common"
for src in "$M"/mtmd.cpp "$M"/mtmd-audio.cpp "$M"/mtmd-image.cpp "$M"/mtmd-helper.cpp "$M"/mtmd-helper-gen.cpp \
           "$M"/clip.cpp "$M"/models/*.cpp "$L"/vendor/hash/hash.cpp "$L"/vendor/hash/xxhash/xxhash.c \
           "$L"/vendor/hash/sha1/sha1.c "$L"/vendor/hash/sha256/sha256.c "$HERE"/driver.cpp; do
    obj="$OUT/obj/$(echo "$src" | md5sum | cut -c1-12).o"
    case "$src" in *xxhash.c|*sha256.c) cc="gcc -O2 -fPIC -w -I$L/vendor/hash";; *sha1.c) cc="g++ -x c++ -O2 -fPIC -w -I$L/vendor/hash";;
        *) cc="g++ $FLAGS";; esac
    [ -f "$obj" ] && [ "$obj" -nt "$src" ] || echo "$cc -c $src -o $obj"
done | xargs -P "$(nproc)" -I{} sh -c '{}'
g++ -o "$OUT/mtmd-ref" "$OUT"/obj/*.o -L"$LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$LIB" -lpthread
echo "$OUT/mtmd-ref"
