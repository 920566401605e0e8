set -u; T0=$(date +%s); SHA=$1
W=$OUT; mkdir -p /tmp/new
tar -xf .rec.tar -C /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:/tmp/new FLASHBOOK_COMMIT=$SHA
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -c "import torch, triton, pytest, xdist, pandas, nbformat, bs4; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'pytest', pytest.__version__, 'xdist', xdist.__version__, 'pandas', pandas.__version__)"; echo "commit: $SHA (git archive)"; } > $W/provenance.txt 2>&1
cat $W/provenance.txt; echo "setup at $(( $(date +%s)-T0 )) s"
cd /tmp/new
# make gpu-test's first line: every GPU test but the stress suite, 4 workers, alone on the machine
timeout -s INT 300 python3 -m pytest -m gpu -p no:cacheprovider -q -n 4 --dist loadgroup --no-loadscope-reorder --ignore=tests/test_stress_gpu.py --junitxml=$W/matrix.xml > $W/matrix.log 2>&1
echo "matrix rc=$? at $(( $(date +%s)-T0 )) s"; tail -4 $W/matrix.log
# then the stress suite's other classes, as far as the time goes
LEFT=$(( 575 - ($(date +%s)-T0) ))
OMP_NUM_THREADS=1 timeout -s INT $LEFT python3 -m pytest -m gpu -p no:cacheprovider -n 16 --dist loadgroup --no-loadscope-reorder tests/test_stress_gpu.py -k "not decode and not (window or softcap or prefix or varlen or alibi)" -v --junitxml=$W/stress_base.xml > $W/stress_base.log 2>&1
echo "stress base rc=$? at $(( $(date +%s)-T0 )) s"; tail -3 $W/stress_base.log
