#!/usr/bin/env bash
# Builds actpack's libFuzzer targets with clang (AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs each for a bounded time over its seed corpus:
#   codecs/decode_fuzz.cc  over codecs/testdata/decode_corpus  (every codec's decoder)
#   runtime/json_fuzz.cc   over runtime/testdata/json_corpus   (the report parser)
# Usage: bash tools/fuzz.sh [seconds per target, default 20]. New inputs go to a scratch
# directory; a crash leaves its input there and fails the script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_PER_TARGET="${1:-20}"
WORK="$(mktemp -d /tmp/actpack-fuzz.XXXXXX)"
CXX="${CXX_FUZZ:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++
FLAGS=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -ffp-contract=off -I.)
ABSL=(-labsl_statusor -labsl_status -labsl_str_format_internal -labsl_strings
      -labsl_raw_hash_set -labsl_hash -labsl_throw_delegate)
# The codecs' vector kernels (Highway) and their worker threads.
CODEC_LIBS=(-lhwy -lpthread)

codec_sources=$(ls codecs/*.cc codecs/internal/*.cc | grep -vE '_(test|benchmark|fuzz)\.cc$')
# shellcheck disable=SC2086
"$CXX" "${FLAGS[@]}" $codec_sources codecs/decode_fuzz.cc "${ABSL[@]}" "${CODEC_LIBS[@]}" \
  -o "$WORK/decode_fuzz"
"$CXX" "${FLAGS[@]}" runtime/json.cc runtime/json_fuzz.cc "${ABSL[@]}" -o "$WORK/json_fuzz"

run() {
  local name=$1 corpus=$2
  mkdir -p "$WORK/$name-corpus"
  echo "== $name: ${SECONDS_PER_TARGET}s =="
  if ! (cd "$WORK" && "./$name" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
        "$WORK/$name-corpus" "$OLDPWD/$corpus" > "$WORK/$name.log" 2>&1); then
    tail -60 "$WORK/$name.log"
    echo "fuzz: $name FAILED; the input is in $WORK"
    exit 1
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added)" "$WORK/$name.log" || true
}
run decode_fuzz codecs/testdata/decode_corpus
run json_fuzz runtime/testdata/json_corpus
echo "fuzz: no crashes (scratch in $WORK)"
