#!/usr/bin/env bash
# Correct every time, on a GPU, in one run from the repository root of a CUDA machine:
#   bash tools/gpu_correct.sh OUT_DIR [WORKERS] [PART]
#   PART: all (the default), base (the suite without the mask classes), masks (the sliding
#   window, soft-cap and packed-document classes alone), sanitizer (the four tools alone).
#   The whole suite took 420-480 s on 16 workers before the mask classes came; with them
#   it needs two calls of a 10-minute limit: base, then masks and sanitizer.
#   OUT_DIR/stress.xml, stress.log       the GPU stress suite (tests/test_stress_gpu.py):
#                                        every class 60 times, poisoned outputs, float64 checks
#   OUT_DIR/sanitizer_TOOL.{log,json}    one run of every class under compute-sanitizer's
#                                        memcheck, initcheck, racecheck and synccheck, each
#                                        decode case twice (the second through the short path)
# The suite runs first so that the sanitizer runs find every kernel compiled: one process
# compiling every class under the sanitizer takes far longer than the sanitizer itself
# (compiling for sm_90 on a 2-core CPU, one float32 IEEE kernel took 4 to 249 s).
set -u
out=${1:?usage: bash tools/gpu_correct.sh OUT_DIR [WORKERS] [PART]}
workers=${2:-16}
part=${3:-all}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0
masks="window or softcap or prefix or varlen"
case "$part" in
  all) select=() ;;
  base) select=(-k "not ($masks)") ;;
  masks) select=(-k "$masks") ;;
  sanitizer) select=() ;;
  *) echo "PART must be all, base, masks or sanitizer, got $part" >&2; exit 2 ;;
esac
if [ "$part" != sanitizer ]; then
  OMP_NUM_THREADS=1 $py -m pytest -m gpu -n "$workers" --dist loadgroup --no-loadscope-reorder \
    tests/test_stress_gpu.py "${select[@]}" -v --junitxml="$out/stress.xml" > "$out/stress.log" 2>&1 || status=1
  tail -3 "$out/stress.log"
fi
[ "$part" = base ] && exit $status
for tool in memcheck initcheck racecheck synccheck; do
  compute-sanitizer --tool "$tool" --print-limit 20 \
    $py benchmarks/stress.py --out "$out/sanitizer_$tool" --classes --launch-only --subset 1 --repeat 2 \
    > "$out/sanitizer_$tool.log" 2>&1 || status=1
  mv "$out/sanitizer_$tool/stress.json" "$out/sanitizer_$tool.json" 2>/dev/null && rmdir "$out/sanitizer_$tool"
  tail -2 "$out/sanitizer_$tool.log"
done
exit $status
