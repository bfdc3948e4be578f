#!/usr/bin/env bash
# Build llama.cpp's own speculative tools (n-gram lookup drafting) from the llama.cpp that the installed
# llama-cpp-python vendors, so comparisons run the same ggml kernels. CPU only, only the needed targets.
# Idempotent: reuses the downloaded sdist and the build folder; rerunning only rebuilds what changed.
#   Usage: benchmarks/build_llama_cpp.sh            (JOBS=2 by default; runs under nice -n 10)
#   Prints the folder with the binaries (llama-lookup, llama-speculative-simple, llama-server, llama-completion).
set -euo pipefail
# the runtime's cache folder (eagle2_local/formats/cache_root.py): $EAGLE2_LOCAL_CACHE, else the XDG one
cache="${EAGLE2_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle2-local}"
ver="${LLAMA_CPP_PYTHON_VERSION:-$(python -c 'import llama_cpp; print(llama_cpp.__version__)')}"
sdist_dir="$cache/src"
src="$sdist_dir/llama_cpp_python-$ver"
mkdir -p "$sdist_dir"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
  pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$sdist_dir" >&2
  tar xzf "$sdist_dir/llama_cpp_python-$ver.tar.gz" -C "$sdist_dir"
fi
# The sdist names the vendored llama.cpp commit in its changelog entry for this release.
commit=$(awk -v v="## [$ver]" '$0==v{f=1;next} f&&/^## \[/{exit} f' "$src/CHANGELOG.md" \
         | grep -o 'llama.cpp@[0-9a-f]*' | head -1 | cut -d@ -f2)
commit="${commit:-unknown}"
out="$cache/llama.cpp-$commit"
targets=(llama-lookup llama-speculative-simple llama-server llama-completion)
# No AMX kernels (they crash at the first decode on some AMX machines; eagle2-local loads no AMX buffers
# either, so both sides run the same CPU_REPACK kernels): GCC's explicit -mno-* wins over -march=native.
# A folder of its own, so that a build configured before this rule is not reused with AMX in it.
no_amx=()
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null; then
  no_amx=(-DCMAKE_C_FLAGS="-mno-amx-int8 -mno-amx-tile" -DCMAKE_CXX_FLAGS="-mno-amx-int8 -mno-amx-tile")
  out="$out-noamx"
fi
if [ ! -f "$out/build/CMakeCache.txt" ]; then
  cmake -S "$src/vendor/llama.cpp" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON ${no_amx[@]+"${no_amx[@]}"} \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_COMMIT="$commit" -DBUILD_SHARED_LIBS=OFF >&2
fi
nice -n 10 cmake --build "$out/build" -j "${JOBS:-2}" --target "${targets[@]}" >&2
for t in "${targets[@]}"; do test -x "$out/build/bin/$t" || { echo "error: $t was not built" >&2; exit 1; }; done
echo "$out/build/bin"
