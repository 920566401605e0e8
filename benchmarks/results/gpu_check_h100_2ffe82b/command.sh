set -u; T0=$(date +%s)
W=$OUT/w; mkdir -p /tmp/new $W $OUT/rec
tar -xf .rec.tar -C /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; echo "commit: $SHA (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt
cd /tmp/new && PYTHONPATH=/tmp/site:/tmp/new OMP_NUM_THREADS=1 FLASHBOOK_COMMIT=$SHA timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_minimal_bwd.py --junitxml=$W/minimal_bwd.xml > $W/minimal_bwd.log 2>&1; echo "minimal_bwd rc=$? at $(( $(date +%s)-T0 )) s"; tail -2 $W/minimal_bwd.log
cd /tmp/new && FLASHBOOK_COMMIT=$SHA PYTHONPATH=/tmp/site:/tmp/new timeout 330 python3 tools/run_notebooks.py $OUT/rec notebooks/06_gpu_and_triton.ipynb notebooks/07_triton_forward.ipynb notebooks/08_triton_backward.ipynb notebooks/12_masks.ipynb > $W/notebooks.log 2>&1; echo "notebooks rc=$? at $(( $(date +%s)-T0 )) s"; tail -3 $W/notebooks.log
python3 -c "import json; d=json.load(open('$OUT/rec/notebooks.json')); print([(r['notebook'],r['ok'],r['seconds'],(r['error'] or '')[:400]) for r in d['notebooks']])"
REM=$(( 560 - ($(date +%s)-T0) )); echo "remaining $REM s"
if [ $REM -gt 60 ]; then cd /tmp/new && PYTHONPATH=/tmp/site:/tmp/new OMP_NUM_THREADS=1 FLASHBOOK_COMMIT=$SHA timeout $(( REM - 30 )) python3 -m pytest -m gpu -p no:cacheprovider -q -n 8 tests/test_kernels_gpu.py --junitxml=$W/kernels_gpu.xml > $W/kernels_gpu.log 2>&1; echo "kernels_gpu rc=$? at $(( $(date +%s)-T0 )) s"; tail -2 $W/kernels_gpu.log; fi
cd /tmp && tar czf $OUT/results.tar.gz -C $W . && rm -rf $W
ls -la $OUT $OUT/rec | head -20
echo "done at $(( $(date +%s)-T0 )) s"
