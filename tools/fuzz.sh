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
export WORK="$(mktemp -d /tmp/actpack-fuzz.XXXXXX)"
CXX="${CXX_FUZZ:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++
# Objects carry the sanitizers and libFuzzer's coverage hooks; only the link adds its main().
FLAGS=(-std=c++20 -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
       -ffp-contract=off -I.)
LINK_FLAGS=(-fsanitize=fuzzer,address,undefined)
ABSL=(-labsl_statusor -labsl_status -labsl_str_format_internal -labsl_strings
      -labsl_raw_hash_set -labsl_hash -labsl_throw_delegate)
# The codecs' vector kernels (Highway) and their worker threads.
CODEC_LIBS=(-lhwy -lpthread)
JOBS="$(nproc)"

# One object per source, compiled on every core.
codec_sources=$(ls codecs/*.cc codecs/internal/*.cc | grep -vE '_(test|benchmark|fuzz)\.cc$')
mkdir -p "$WORK/obj"
printf '%s\n' $codec_sources codecs/decode_fuzz.cc runtime/json.cc runtime/json_fuzz.cc |
  xargs -P "$JOBS" -I{} sh -c 'exec "$0" "$@" -c {} -o "$WORK/obj/$(echo {} | tr / _).o"' \
    "$CXX" "${FLAGS[@]}"
codec_objects=$(for source in $codec_sources; do echo "$WORK/obj/$(echo "$source" | tr / _).o"; done)
# shellcheck disable=SC2086
"$CXX" "${LINK_FLAGS[@]}" $codec_objects "$WORK/obj/codecs_decode_fuzz.cc.o" "${ABSL[@]}" \
  "${CODEC_LIBS[@]}" -o "$WORK/decode_fuzz"
"$CXX" "${LINK_FLAGS[@]}" "$WORK/obj/runtime_json.cc.o" "$WORK/obj/runtime_json_fuzz.cc.o" \
  "${ABSL[@]}" -o "$WORK/json_fuzz"

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
# The two targets at once (one core each); each prints its stats or its failure.
run decode_fuzz codecs/testdata/decode_corpus & decode=$!
run json_fuzz runtime/testdata/json_corpus & json=$!
status=0
wait "$decode" || status=1
wait "$json" || status=1
[ "$status" = 0 ] || exit 1
echo "fuzz: no crashes (scratch in $WORK)"
