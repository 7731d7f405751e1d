# one device call: the lead probe over $SHAPES, then the GPU tests named ($TESTS); logs to $OUT
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
here=benchmarks/results/h200/experiments/int8_lead
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout ${PROBE_LIMIT:-240} python3 $here/probe.py $SHAPES 2>&1 | tee "$OUT/probe.txt"
if [ -n "$TESTS" ]; then
  timeout ${TEST_LIMIT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider $PYTEST_ARGS $TESTS > "$OUT/gpu_tests.log" 2>&1
  tail -15 "$OUT/gpu_tests.log"
fi
