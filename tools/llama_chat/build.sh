#!/bin/sh
# Builds ./llama-chat (driver.cpp) from a llama.cpp source tree (default: the one vendored in llama-cpp-python's
# sdist, unpacked) against the installed llama-cpp-python's libllama: only common/'s chat, Jinja, PEG-parser and JSON
# sources are compiled (stubs.cpp stands in for the parts of common.cpp it does not need).
#   sh tools/llama_chat/build.sh [LLAMA_CPP_SRC] [OUT_DIR]
set -e
L=${1:-/tmp/lcp_src/llama_cpp_python-0.3.36/vendor/llama.cpp}
OUT=${2:-/tmp/llama_chat}
HERE=$(cd "$(dirname "$0")" && pwd)
LIB=$(python -c "import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'))")
mkdir -p "$OUT/obj"
FLAGS="-std=c++17 -O1 -I$L/common -I$L/include -I$L/ggml/include -I$L/vendor"
for src in "$L"/common/parsers/*.cpp "$L"/common/jinja/*.cpp "$L"/common/chat*.cpp "$L"/common/json*.cpp \
           "$L"/common/log.cpp "$L"/common/peg-parser.cpp "$L"/common/unicode.cpp "$L"/common/trie.cpp \
           "$L"/common/common.cpp "$HERE"/driver.cpp "$HERE"/stubs.cpp; do
    obj="$OUT/obj/$(echo "$src" | md5sum | cut -c1-12).o"
    [ -f "$obj" ] || echo "g++ $FLAGS -c $src -o $obj"
done | xargs -P "$(nproc)" -I{} sh -c '{}'
g++ -o "$OUT/llama-chat" "$OUT"/obj/*.o -L"$LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$LIB" -lpthread
echo "$OUT/llama-chat"
