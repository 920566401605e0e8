#!/usr/bin/env bash
set -u
mkdir -p $OUT/r
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/r/provenance.txt 2>&1
export OMP_NUM_THREADS=1 TRY_ON_GPU=1
timeout 400 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_fused_bwd.py tests/test_kernel_masks.py tests/test_dispatch.py \
  --junitxml=$OUT/r/masks_fused.junit.xml > $OUT/r/run.log 2>&1; echo "rc=$?" >> $OUT/r/provenance.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/r/run.log | tail -30
cd $OUT && tar czf r.tgz r && rm -rf r
