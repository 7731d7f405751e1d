# one device call: probe.py at the shapes of SHAPES (default both), then the int8 GPU tests named by TESTS (default
# the warp-specialised kernels' configurations and the large products' candidates); logs to $OUT
set -o pipefail
here=benchmarks/results/h200/experiments/int8_drained
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout ${PROBE_LIMIT:-150} python3 $here/probe.py ${SHAPES:-0 1} 2>&1 | tee "$OUT/probe.txt"
timeout ${TESTS_LIMIT:-170} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_int8.py \
    -k "${TESTS:-warp_specialised or large_product}" 2>&1 | tail -30 > "$OUT/gpu_int8_tests.log"
tail -5 "$OUT/gpu_int8_tests.log"
