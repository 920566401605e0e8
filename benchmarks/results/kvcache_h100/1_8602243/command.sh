set -u; T0=$(date +%s)
mkdir -p /tmp/rec $OUT/st $OUT/bench && tar -xf .rec.tar -C /tmp/rec && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
cd /tmp/rec && export PYTHONPATH=/tmp/site:/tmp/rec
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; echo "commit $COMMIT (git archive)"; } > $OUT/st/provenance.txt 2>&1
cp $OUT/st/provenance.txt $OUT/bench/
OMP_NUM_THREADS=1 timeout 170 python3 -m pytest -m gpu -n 8 -p no:cacheprovider tests/test_kvcache.py tests/test_decode.py tests/test_kernels_gpu.py -k "kvcache or decode" -v --junitxml=$OUT/st/tests.xml > $OUT/st/tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/st/tests.log; grep -E "FAILED|ERROR" $OUT/st/tests.log | head
echo "tests at $(( $(date +%s)-T0 )) s"
OMP_NUM_THREADS=1 FLASHBOOK_STRESS_RUNS=60 timeout 200 python3 -m pytest -m gpu -n 8 --dist loadgroup tests/test_stress_gpu.py -k "decode and softcap" -v -p no:cacheprovider --junitxml=$OUT/st/stress.xml > $OUT/st/stress.log 2>&1; echo "stress rc=$?"; tail -2 $OUT/st/stress.log; grep -E "FAILED|ERROR" $OUT/st/stress.log | head
echo "stress at $(( $(date +%s)-T0 )) s"
for r in 1 2; do
  LEFT=$(( 580 - ($(date +%s)-T0) )); [ $LEFT -lt 60 ] && break
  timeout $LEFT python3 benchmarks/decode_bench.py --out $OUT/bench/r$r --batches 1,8,64 --seqs 2K,32K,128K --impl flash_decode,flash_decode-softcap,flash_decode-lse,kvcache,kvcache-append,kvcache-rotary,kvcache-paged-append,flash_decode-paged,sdpa-cudnn --rep-ms 25 --budget-s 300 > $OUT/bench/r$r.log 2>&1; echo "bench r$r rc=$? at $(( $(date +%s)-T0 )) s"; tail -3 $OUT/bench/r$r.log
done
echo "done at $(( $(date +%s)-T0 )) s"
