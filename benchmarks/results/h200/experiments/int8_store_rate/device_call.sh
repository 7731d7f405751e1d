# one device call: the store-rate probe, then clocks and power under our kernel and cuBLASLt's; logs to $OUT
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
here=benchmarks/results/h200/experiments/int8_store_rate
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee "$OUT/gpu.txt"
timeout 120 python3 $here/stores.py 2>&1 | tee "$OUT/stores.txt"
timeout 120 python3 $here/power.py ${ROUNDS:-2} > "$OUT/power.txt" 2>&1; head -8 "$OUT/power.txt"
