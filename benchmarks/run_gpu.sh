#!/usr/bin/env bash
# The GPU machine's one entry point (run there through the device tool, from the repository root):
# installs the carried wheels (.whl/, nvmath-python; .whl/extra/, its needs, only where the machine lacks
# them), runs every test marked gpu or peer (PyTorch is there), the GPU benchmarks, then
# profiles the MLP and CNN steps kernel by kernel.
# Logs and JSON results go to $OUT (the device tool brings them back) or to benchmarks/results.
#     bash benchmarks/run_gpu.sh [tests|tests1|tests2|bench|conv|int8|float8|compile|gpt|dp|profile|ours|all]
#     (tests1 and tests2: every other test file in name order, from the first and from the second, each its own
#     log, for a device call too short for the whole suite; conv, int8,
#     float8, compile: those benchmarks alone;
#     gpt: the GPT training step against torch eager, torch.compile (default and reduce-overhead) and jax.jit alone
#     (bench_gpt_gpu.py), layer norm and cross-entropy against torch's (bench_norms_gpu.py), gelu over values of
#     three ranges (bench_gelu_gpu.py) and an embedding's gradient (bench_embedding_gradient_gpu.py);
#     cpu: the CPU benchmarks (products, MLP, CNN and GPT steps against NumPy and torch's CPU eager mode) on this machine's cores;
#     dp: the data-parallel tests and benchmark, which need two GPUs or more and run under all only where there are;
#     ours: our side alone of the fused, MLP, CNN, GPT and norm benchmarks (no peers: plain CuPy, the copy floor and
#     torch's norms stay), to hold one tree's figures against another's on one machine)
set -o pipefail
what=${1:-all}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    wheels=(.whl/*.whl)
    for module in cuda.core cuda.pathfinder cuda.bindings; do
        python3 -c "import $module" 2>/dev/null || wheels+=(.whl/extra/"$(echo "${module/./_}")"-*.whl)
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
status=0
files=(tests/test_*.py)
tested=()
case "$what" in
    tests|all) tested=(tests); log=gpu_tests.log ;;
    tests1|tests2) for i in "${!files[@]}"; do
            [ $(( i % 2 + 1 )) -eq "${what#tests}" ] && tested+=("${files[$i]}")
        done
        log=gpu_tests_${what#tests}.log ;;
esac
if [ ${#tested[@]} -gt 0 ]; then
    # the edge fuzzer compiles a program an example: 10 of each here keep the suite within one device call
    CORTADO_FUZZ_EXAMPLES=${CORTADO_FUZZ_EXAMPLES:-10} python3 -m pytest -q -m "gpu or peer" -p no:cacheprovider \
        "${tested[@]}" 2>&1 | tee "$out/$log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    python3 benchmarks/bench_fused_gpu.py --out "$out/fused_gpu.json" 2>&1 | tee "$out/bench_fused.log" || status=1
    python3 benchmarks/bench_mlp_gpu.py --out "$out/mlp_gpu.json" 2>&1 | tee "$out/bench_mlp.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = conv ] || [ "$what" = all ]; then
    python3 benchmarks/bench_cnn_gpu.py --out "$out/cnn_gpu.json" 2>&1 | tee "$out/bench_cnn.log" || status=1
    python3 benchmarks/bench_conv_layers_gpu.py --out "$out/conv_layers_gpu.json" 2>&1 | tee "$out/bench_conv_layers.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = int8 ] || [ "$what" = all ]; then
    python3 benchmarks/bench_int8_gpu.py --out "$out/int8_gpu.json" 2>&1 | tee "$out/bench_int8.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = float8 ] || [ "$what" = all ]; then
    python3 benchmarks/bench_float8_gpu.py --out "$out/float8_gpu.json" 2>&1 | tee "$out/bench_float8.log" || status=1
    python3 benchmarks/bench_float8_gpt_gpu.py --out "$out/float8_gpt_gpu.json" 2>&1 | tee "$out/bench_float8_gpt.log" \
        || status=1
fi
if [ "$what" = bench ] || [ "$what" = compile ] || [ "$what" = all ]; then
    python3 benchmarks/bench_compile_gpu.py --out "$out/compile_gpu.json" 2>&1 | tee "$out/bench_compile.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = gpt ] || [ "$what" = all ]; then
    python3 benchmarks/bench_gpt_gpu.py --out "$out/gpt_gpu.json" 2>&1 | tee "$out/bench_gpt.log" || status=1
    python3 benchmarks/bench_norms_gpu.py --out "$out/norms_gpu.json" 2>&1 | tee "$out/bench_norms.log" || status=1
    python3 benchmarks/bench_gelu_gpu.py --out "$out/gelu_gpu.json" 2>&1 | tee "$out/bench_gelu.log" || status=1
    python3 benchmarks/bench_embedding_gradient_gpu.py --out "$out/embedding_gradient_gpu.json" 2>&1 \
        | tee "$out/bench_embedding_gradient.log" || status=1
fi
if [ "$what" = ours ]; then
    python3 benchmarks/bench_fused_gpu.py --skip torch,torch.compile,cupy.fuse --out "$out/fused_gpu.json" 2>&1 \
        | tee "$out/bench_fused.log" || status=1
    python3 benchmarks/bench_mlp_gpu.py --skip torch,torch.compile,jax --out "$out/mlp_gpu.json" 2>&1 \
        | tee "$out/bench_mlp.log" || status=1
    python3 benchmarks/bench_cnn_gpu.py --skip torch,torch.compile,jax --out "$out/cnn_gpu.json" 2>&1 \
        | tee "$out/bench_cnn.log" || status=1
    python3 benchmarks/bench_gpt_gpu.py --only cortado --out "$out/gpt_gpu.json" 2>&1 | tee "$out/bench_gpt.log" || status=1
    python3 benchmarks/bench_norms_gpu.py --out "$out/norms_gpu.json" 2>&1 | tee "$out/bench_norms.log" || status=1
fi
if [ "$what" = cpu ]; then
    python3 -c "import os; print(os.cpu_count(), 'cores,', len(os.sched_getaffinity(0)), 'usable')" | tee "$out/cpu.txt"
    python3 benchmarks/bench_gemm_cpu.py --out "$out/gemm_cpu.json" 2>&1 | tee "$out/bench_gemm_cpu.log" || status=1
    python3 benchmarks/bench_step_cpu.py --out "$out/step_cpu.json" 2>&1 | tee "$out/bench_step_cpu.log" || status=1
    python3 benchmarks/bench_cnn_cpu.py --out "$out/cnn_cpu.json" 2>&1 | tee "$out/bench_cnn_cpu.log" || status=1
    python3 benchmarks/bench_gpt_cpu.py --out "$out/gpt_cpu.json" 2>&1 | tee "$out/bench_gpt_cpu.log" || status=1
fi
gpus=$(nvidia-smi -L | wc -l)
if [ "$what" = dp ] || { [ "$what" = all ] && [ "$gpus" -ge 2 ]; }; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_distributed.py 2>&1 | tee "$out/gpu_distributed_tests.log" || status=1
    sizes=1; for n in 2 4 8; do [ "$n" -le "$gpus" ] && sizes="$sizes,$n"; done
    python3 benchmarks/bench_data_parallel_gpu.py --gpus "$sizes" --out "$out/data_parallel_gpu.json" 2>&1 \
        | tee "$out/bench_data_parallel.log" || status=1
fi
if [ "$what" = profile ] || [ "$what" = all ]; then
    python3 benchmarks/profile_gpu.py --out "$out/profile_gpu.txt" 2>&1 | grep -A12 "kernels, "  || status=1
fi
exit $status
