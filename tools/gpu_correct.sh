#!/usr/bin/env bash
# Correct every time, on a GPU, in one run from the repository root of a CUDA machine:
#   bash tools/gpu_correct.sh OUT_DIR [WORKERS] [PART]
#   PART: all (the default), base (the suite without the mask classes), masks (the sliding
#   window, soft-cap, prefix, ALiBi and packed-document classes alone), sanitizer (the four tools alone).
#   The whole suite took 420-650 s on 16 workers before the mask classes came; with them
#   it may need two calls of a 10-minute limit (GPU_CORRECT_PYTEST="--deselect ..." for
#   the second).
#   OUT_DIR/provenance.txt               date, GPU, driver, versions, commit, this command
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
masks="window or softcap or prefix or varlen or alibi"
case "$part" in
  all) select=() ;;
  base) select=(-k "not ($masks)") ;;
  masks) select=(-k "$masks") ;;
  sanitizer) select=() ;;
  *) echo "PART must be all, base, masks or sanitizer, got $part" >&2; exit 2 ;;
esac
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | sed -n '1,20p'
  echo "bash tools/gpu_correct.sh $out $workers $part ${GPU_CORRECT_PYTEST:-}"; } > "$out/provenance.txt" 2>&1
if [ "$part" != sanitizer ]; then
  # GPU_CORRECT_PYTEST: more pytest arguments (e.g. --deselect of the tests an earlier call ran)
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 $py -m pytest -m gpu -n "$workers" --dist loadgroup --no-loadscope-reorder \
    tests/test_stress_gpu.py "${select[@]}" ${GPU_CORRECT_PYTEST:-} -v --junitxml="$out/stress.xml" \
    > "$out/stress.log" 2>&1 || status=1
  tail -3 "$out/stress.log"
fi
[ "$part" = base ] && exit $status
# The four tools at once, one process each: they share the GPU, and each spends most of
# its time on the host (the kernels here are small).
pids=()
for tool in memcheck initcheck racecheck synccheck; do
  compute-sanitizer --tool "$tool" --print-limit 20 \
    $py benchmarks/stress.py --out "$out/sanitizer_$tool" --classes --launch-only --subset 1 --repeat 2 \
    > "$out/sanitizer_$tool.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for tool in memcheck initcheck racecheck synccheck; do
  mv "$out/sanitizer_$tool/stress.json" "$out/sanitizer_$tool.json" 2>/dev/null && rmdir "$out/sanitizer_$tool"
  echo "$tool: $(tail -2 "$out/sanitizer_$tool.log" | tr '\n' ' ')"
done
exit $status
