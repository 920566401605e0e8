set -u; T0=$(date +%s); SHA=$1; python3 -c "import pandas; print(\"pandas\", pandas.__version__)"
W=$OUT/w; mkdir -p /tmp/new $W $OUT/rec
tar -xf .rec.tar -C /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:/tmp/new OMP_NUM_THREADS=1 FLASHBOOK_COMMIT=$SHA
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, pytest, xdist; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'pytest', pytest.__version__, 'xdist', xdist.__version__)"; echo "commit: $SHA (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt; echo "setup at $(( $(date +%s)-T0 )) s"
cd /tmp/new && timeout 200 python3 tools/run_notebooks.py $OUT/rec notebooks/08_triton_backward.ipynb > $W/notebooks.log 2>&1; echo "notebooks rc=$? at $(( $(date +%s)-T0 )) s"; tail -3 $W/notebooks.log
python3 -c "import json; d=json.load(open('$OUT/rec/notebooks.json')); print([(r['notebook'],r['ok'],r['seconds'],(r['error'] or '')[-600:]) for r in d['notebooks']])"
REM=$(( 570 - ($(date +%s)-T0) )); echo "remaining $REM s"
cd /tmp/new && timeout $(( REM - 20 )) python3 -m pytest -m gpu -p no:cacheprovider -q -n 8 --dist loadgroup tests/test_kernels_gpu.py tests/test_hopper_gpu.py tests/test_minimal_bwd.py --junitxml=$W/gpu_tests.xml > $W/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(( $(date +%s)-T0 )) s"; tail -15 $W/gpu_tests.log
cd /tmp && tar czf $OUT/results.tar.gz -C $W . && cp $W/*.log $W/provenance.txt $OUT/ 2>/dev/null
echo "done at $(( $(date +%s)-T0 )) s"
