#!/usr/bin/env bash
# one device call: provenance, today's GPU-facing changes, then the GPU test matrix (no stress classes)
set -u
mkdir -p $OUT/r
{
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, pytest, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'pytest', pytest.__version__, 'python', sys.version.split()[0])"
git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -5
echo "command: bash tools/_run1.sh (pytest as below)"
} > $OUT/r/provenance.txt 2>&1
export OMP_NUM_THREADS=1
# A: the fused-backward tests (today: the interpreter's tiles given on the GPU too) and the front door (flash-attn's names)
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_fused_bwd.py tests/test_dispatch.py tests/test_kernel_masks.py \
  --junitxml=$OUT/r/a_fused_dispatch.junit.xml > $OUT/r/a.log 2>&1; echo "A rc=$?" >> $OUT/r/provenance.txt
# B: every test marked gpu except the stress classes
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu -n 16 --dist loadgroup --no-loadscope-reorder tests \
  --ignore=tests/test_stress_gpu.py --junitxml=$OUT/r/b_gpu.junit.xml > $OUT/r/b.log 2>&1; echo "B rc=$?" >> $OUT/r/provenance.txt
tail -5 $OUT/r/a.log $OUT/r/b.log
cat $OUT/r/provenance.txt
cd $OUT && tar czf r.tgz r && rm -rf r
