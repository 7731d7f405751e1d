# one device call: the new test on the tree without the fix (it should fail), then with it, then the conv and beside
# GPU tests; logs to $OUT
here=benchmarks/results/h200/experiments/nested_choices
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
test=tests/test_gpu_conv.py::test_every_convolution_runs_the_algorithms_the_first_one_chose_at_every_level
git apply -R $here/fix.patch && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider $test > "$OUT/without_fix.log" 2>&1
tail -3 "$OUT/without_fix.log"; grep -E "^E " "$OUT/without_fix.log" | head -5
git apply $here/fix.patch && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider $test > "$OUT/with_fix.log" 2>&1
tail -3 "$OUT/with_fix.log"
