# one device call: the GPU tests named, then the probe and Nsight Compute over it; logs to $OUT
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
here=benchmarks/results/h200/experiments/int8_epilogue
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ -n "$TESTS" ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider $PYTEST_ARGS $TESTS > "$OUT/gpu_tests.log" 2>&1
fi
timeout 240 python3 $here/${PROBE:-probe.py} $SHAPES 2>&1 | tee "$OUT/${PROBE:-probe.py}.txt" | tail -5
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -n "$ncu" ]; then
  timeout 200 "$ncu" --clock-control none --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats python3 $here/probe.py --profile 0 > "$OUT/ncu.txt" 2>&1
  tail -3 "$OUT/ncu.txt"
fi
tail -3 "$OUT/gpu_tests.log" 2>/dev/null
