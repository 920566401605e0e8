set -u; T0=$(date +%s); SHA=$1
W=$OUT; mkdir -p /tmp/new
tar -xf .rec.tar -C /tmp/new
export PYTHONPATH=/tmp/new FLASHBOOK_COMMIT=$SHA
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -c "import torch, triton, pytest, xdist, pandas; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'pytest', pytest.__version__, 'xdist', xdist.__version__, 'pandas', pandas.__version__)"; echo "commit: $SHA (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt
cd /tmp/new
# the stress suite's decode classes (the decode, kvcache and append kernels changed since the last H200 run)
OMP_NUM_THREADS=1 timeout -s INT 500 python3 -m pytest -m gpu -p no:cacheprovider -n 11 --dist loadgroup --no-loadscope-reorder tests/test_stress_gpu.py -k decode -v --junitxml=$W/stress_decode.xml > $W/stress_decode.log 2>&1 &
A=$!
# make gpu-test's first line: every GPU test but the stress suite, 4 workers
timeout -s INT 500 python3 -m pytest -m gpu -p no:cacheprovider -q -n 4 --dist loadgroup --no-loadscope-reorder --ignore=tests/test_stress_gpu.py --junitxml=$W/matrix.xml > $W/matrix.log 2>&1 &
B=$!
wait $B; echo "matrix rc=$? at $(( $(date +%s)-T0 )) s"; tail -6 $W/matrix.log
wait $A; echo "stress decode rc=$? at $(( $(date +%s)-T0 )) s"; tail -4 $W/stress_decode.log
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
