set -u; T0=$(date +%s)
W=$OUT/w; mkdir -p /tmp/new /tmp/old $W/st $W/bench $W/host
tar -xf .rec.tar -C /tmp/new && tar -xf .rec_old.tar -C /tmp/old
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl 2>&1 | tail -2
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; echo "new: $NEW (git archive), old: $OLD (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt
cd /tmp/new && PYTHONPATH=/tmp/site:/tmp/new OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -m gpu -n 8 -p no:cacheprovider tests/test_kvcache.py tests/test_decode.py tests/test_kernels_gpu.py -k "kvcache or decode or append" -q --junitxml=$W/st/tests.xml > $W/st/tests.log 2>&1; echo "tests rc=$?"; tail -2 $W/st/tests.log; grep -E "^FAILED" $W/st/tests.log | head
echo "tests at $(( $(date +%s)-T0 )) s"
for r in 1 2; do for tree in old new; do
  cd /tmp/$tree && PYTHONPATH=/tmp/$tree timeout 60 python3 /tmp/new/benchmarks/kvcache_host.py --out $W/host/${tree}_r$r > $W/host/${tree}_r$r.log 2>&1; echo "host $tree r$r rc=$?"
done; done
grep -h "rotary\|append" $W/host/*_r1.log | head -20
IMPL=flash_decode,kvcache,kvcache-append,kvcache-rotary,kvcache-paged-append
for r in 1 2 3; do for tree in old new; do
  LEFT=$(( 520 - ($(date +%s)-T0) )); [ $LEFT -lt 30 ] && break 2
  cd /tmp/$tree && PYTHONPATH=/tmp/site:/tmp/$tree timeout $LEFT python3 benchmarks/decode_bench.py --out $W/bench/${tree}_r$r --batches 1,8 --seqs 2K,32K --impl $IMPL --rep-ms 25 --budget-s 300 > $W/bench/${tree}_r$r.log 2>&1; echo "bench $tree r$r rc=$? at $(( $(date +%s)-T0 )) s"
done; done
cd /tmp && tar czf $OUT/results.tar.gz -C $W . && rm -rf $W
echo "done at $(( $(date +%s)-T0 )) s"
