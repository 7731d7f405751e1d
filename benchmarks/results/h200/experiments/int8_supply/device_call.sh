# one device call: probe.py (the supply probe), then the whole GPU suite (bash benchmarks/run_gpu.sh tests) unless
# NO_SUITE is set; logs to $OUT. probe_order.py and probe_pingpong.py run the same way, from this folder.
set -o pipefail
here=benchmarks/results/h200/experiments/int8_supply
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 timeout ${PROBE_LIMIT:-150} python3 $here/probe.py 2>&1 | tee "$OUT/probe.txt"
if [ -z "$NO_SUITE" ]; then
  timeout ${SUITE_LIMIT:-560} bash benchmarks/run_gpu.sh tests > "$OUT/suite_stdout.txt" 2>&1
  tail -25 "$OUT/gpu_tests.log"
fi
