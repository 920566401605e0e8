set -u; T0=$(date +%s); SHA=$1
W=$OUT; mkdir -p /tmp/new
tar -xf .rec.tar -C /tmp/new
export PYTHONPATH=/tmp/new OMP_NUM_THREADS=1 FLASHBOOK_COMMIT=$SHA
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, pytest, xdist; print('torch', torch.__version__, 'triton', triton.__version__, 'pytest', pytest.__version__, 'xdist', xdist.__version__)"; echo "commit: $SHA (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt
cd /tmp/new && timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q -n 4 --dist loadgroup tests/test_minimal_bwd.py tests/test_hopper_gpu.py tests/test_kernels_gpu.py --junitxml=$W/gpu_tests.xml > $W/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(( $(date +%s)-T0 )) s"; tail -8 $W/gpu_tests.log
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
