"""The tables of docs/benchmarks.md that come from one results file, made from that file, so that a table never says
other than the run it cites.

    python benchmarks/tables.py            # rewrite those tables from benchmarks/results/
    python benchmarks/tables.py --check    # exit 1, naming them, where a table differs from its file

In the page each such table lies between ``<!-- table KIND PATH -->`` and ``<!-- end table -->``: ``KIND`` names
its maker in ``MAKERS``, ``PATH`` its results file under ``benchmarks/results/``. A test
(tests/test_benchmark_tables.py) checks that every table is the one its file makes.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
MARKED = re.compile(r"(<!-- table (\S+) (\S+) -->\n)(.*?)(<!-- end table -->)", re.S)
MIB = 1 << 20

# a training step's contestants as the tables name them, ours first
OURS = {"cortado": "cortado", "cortado (heuristic GEMMs)": "cortado, heuristic GEMMs",
        "cortado nondeterministic": "cortado, `deterministic=False`", "cortado in order": "cortado, `overlap_updates=False`"}
PEERS = {"torch": "torch eager", "torch.compile": "torch.compile", "torch.compile reduce-overhead": "torch.compile",
         "jax": "jax.jit"}


def milliseconds(ms):
    """A time in milliseconds to three or four significant digits."""
    return f"{ms:.1f} ms" if ms >= 100 else f"{ms:.2f} ms" if ms >= 10 else f"{ms:.3f} ms"


def compile_mode(results, name, contestant):
    """torch.compile's mode for contestant ``name``: its own, the run's, or the one its note names."""
    mode = contestant.get("compile_mode") or results.get("compile_mode")
    if mode is None:
        found = re.search(r"mode='([\w-]+)'", results.get("notes", {}).get(name, ""))
        mode = found.group(1) if found else "default"
    return mode


def case_label(case):
    """What a step's case trains: the GPT's shape, an MLP's layers, the CNN's images."""
    if "heads" in case:
        return (f"{case['size']}: {case['layers']} layers, width {case['width']}, {case['heads']} heads, "
                f"context {case['context']}, batch {case['batch']}")
    if "image" in case:
        return f"{case['image']} images, batch {case['batch']}"
    return f"{case['layers']}, batch {case['batch']}"


def steps_table(results):
    """A training step's benchmark (``bench_gpt_gpu.py``, ``bench_mlp_gpu.py``, ``bench_cnn_gpu.py``): a row a case,
    ours and each peer's milliseconds a step (a peer's time over ours beside it, ``over_ours``: above 1, ours is
    faster), the GEMM floor where the run measured one, and the peak memory against torch eager's where it measured
    both."""
    cases = results["cases"] if "cases" in results else results["cnn"]["cases"]
    names = list(dict.fromkeys(n for case in cases for n in case["contestants"]))
    ours = [n for n in OURS if n in names]
    peers = [n for n in PEERS if n in names]
    floor = any("gemm_floor" in case for case in cases)
    memory = any("torch_bytes" in case.get("memory", {}) for case in cases)
    example = {n: next(case["contestants"][n] for case in cases if n in case["contestants"]) for n in peers}
    header = (["case", "dtype"] + [OURS[n] for n in ours]
              + [PEERS[n] + (f" ({compile_mode(results, n, example[n])})" if n.startswith("torch.compile") else "")
                 for n in peers]
              + (["GEMM floor"] if floor else []) + (["peak MiB (ours / torch eager)"] if memory else []))
    rows = []
    for case in cases:
        contestants = case["contestants"]
        cells = [case_label(case), case["dtype"]]
        cells += [milliseconds(contestants[n]["ms"]) if n in contestants else "" for n in ours]
        for n in peers:
            ratio = over_ours(contestants.get(n), contestants.get("cortado"))
            cells.append("" if n not in contestants else
                         milliseconds(contestants[n]["ms"]) + ("" if ratio is None else f" ({ratio:.2f}x)"))
        if floor:
            cells.append(milliseconds(case["gemm_floor"]["ms"]) if "gemm_floor" in case else "")
        if memory:
            used = case.get("memory", {})
            cells.append(f"{used['ours_bytes'] / MIB:.0f} / {used['torch_bytes'] / MIB:.0f}"
                         if "torch_bytes" in used and "ours_bytes" in used else "")
        rows.append(cells)
    return markdown(header, rows)


def microseconds(us):
    """A time in microseconds to four significant digits."""
    return f"{us:.0f} µs" if us >= 1000 else f"{us:.1f} µs"


def fused_table(results):
    """``bench_fused_gpu.py``: a row a case, ours with its inputs as state and fed CuPy arrays (each with its share
    of the copy floor: the case's bytes at the copy rate of the same run), then the peers, then that floor."""
    names = {"chain": "`tanh(0.5*x+y)*sigmoid(x)+y*y`", "adam": "Adam update (p, m, v, g)"}
    columns = {"cortado (state)": "cortado, inputs as state", "cortado": "cortado, CuPy feeds",
               "torch.compile": "torch.compile", "cupy.fuse": "cupy.fuse", "torch": "torch eager"}
    rows = []
    for key, case in results["cases"].items():
        contestants, floor = case["contestants"], case["copy_floor_us"]
        cells = [names.get(key, key)]
        for k, n in enumerate(columns):
            us = contestants[n]["us"] if n in contestants else None
            share = "" if us is None or not n.startswith("cortado") else \
                f" ({floor / us:.0%}{' of floor' if k == 0 else ''})"
            cells.append("" if us is None else microseconds(us) + share)
        rows.append(cells + [microseconds(floor)])
    return markdown(["case", *columns.values(), "copy floor"], rows)


def products_us(ms):
    """A product's time in microseconds: two decimals under 10, one above."""
    us = ms * 1e3
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


def int8_table(results):
    """``bench_int8_gpu.py``: a row a shape, microseconds a product: ours as the program chose it (naming cuBLASLt
    where it chose cuBLASLt's int8 call), our fastest own kernel, then the peers."""
    header = ["M x N x K", "cortado (its choice)", "our fastest kernel", "cuBLASLt int8", "torch._int_mm",
              "cuBLASLt float16"]
    rows = []
    for gemm in results["gemms"]:
        ours = gemm["cortado"]
        chose = " (cuBLASLt)" if ours.get("choice", "").startswith("cuBLASLt") else ""
        rows.append([gemm["shape"], products_us(ours["ms"]) + chose, products_us(ours["kernel_ms"])]
                    + [products_us(gemm[k]["ms"]) if k in gemm else "" for k in
                       ("cublaslt_int8", "torch_int_mm", "cublaslt_f16")])
    return markdown(header, rows)


def int8_requantized_table(results):
    """``bench_int8_gpu.py``'s quantized layer's products, requantized to int8: a row a shape, microseconds a product:
    ours as the program chose it, our fastest own kernel, cuBLASLt's int8 GEMM and the epilogue kernel after it."""
    rows = []
    for row in results["requantized"]:
        ours = row["cortado"]
        rows.append([row["shape"], products_us(ours["ms"]), products_us(ours["kernel_ms"]),
                     products_us(ours["library_ms"]), f"{row['over_library']:.2f}x"])
    return markdown(["M x N x K", "cortado (its choice)", "our fastest kernel", "cuBLASLt int8 + epilogue kernel",
                     "speed-up"], rows)


def float8_table(results):
    """``bench_float8_gpu.py``: a row a shape, microseconds a product: ours in float8 (with its rate), torch's scaled
    product, ours in bfloat16, ours in float8 with a bias and gelu epilogue, and with an e5m2 operand."""
    header = ["M x N x K", "cortado float8", "torch._scaled_mm", "cortado bfloat16", "float8 + bias + gelu",
              "e5m2 x e4m3"]
    rows = []
    for gemm in results["gemms"]:
        ours = gemm["cortado_float8"]
        rows.append([gemm["shape"], f"{products_us(ours['ms'])} ({ours['tflops']:.0f}"
                     + (" TFLOP/s)" if not rows else ")")]
                    + [products_us(gemm[k]["ms"]) if k in gemm else "" for k in
                       ("torch_scaled_mm", "cortado_bfloat16", "cortado_float8_bias_gelu", "cortado_e5m2")])
    return markdown(header, rows)


def gelu_table(results):
    """``bench_gelu_gpu.py``: a row a range of values (N(0, 1) with 1% of them at -13 in the last), microseconds: our
    call, its kernel timed alone, torch's call."""
    rows = [[row["values"], f"{row['cortado']['ms'] * 1e3:.1f}", f"{row['cortado']['kernel_ms'] * 1e3:.1f}",
             f"{row['torch']['ms'] * 1e3:.1f}"] for row in results["rows"]]
    return markdown(["values", "cortado call", "its kernel", "torch"], rows)


def data_parallel_table(results):
    """``bench_data_parallel_gpu.py``: a row a model and contestant, milliseconds a step on each world size (each
    GPU its own batch), samples a second on the largest, the scaling efficiency and ours over DDP's throughput on
    each size past one."""
    names = {"mlp": "MLP 8192x3", "cnn": "ResNet CNN"}
    sizes = sorted({int(n) for model in results["results"].values() for runs in model.values() for n in runs})
    more = [n for n in sizes if n > 1]
    header = (["model", "contestant"] + [f"{n} GPU{'s' if n > 1 else ''} ms/step" for n in sizes]
              + [f"samples/s on {sizes[-1]}", f"efficiency on {' / '.join(map(str, more))}",
                 f"ours / DDP on {' / '.join(map(str, more))}"])
    rows = []
    for model, contestants in results["results"].items():
        shape = results["models"][model]
        label = f"{names.get(model, model)}, {shape['dtype']}, batch {shape['batch_per_gpu']} a GPU"
        for k, (name, runs) in enumerate(contestants.items()):
            at = {int(n): run for n, run in runs.items()}
            rows.append([label if k == 0 else "", name]
                        + [f"{at[n]['ms']:.2f}" if n in at else "" for n in sizes]
                        + [f"{at[sizes[-1]]['samples_per_s']:,.0f}" if sizes[-1] in at else "",
                           " / ".join(f"{at[n]['scaling_efficiency']:.3f}" if n in at else "-" for n in more),
                           " / ".join(f"{at[n]['over_ddp']:.2f}" for n in more if "over_ddp" in at.get(n, {}))])
    return markdown(header, rows)


def cpu_steps_table(results):
    """``bench_step_cpu.py``: a row an MLP, the medians of its step's rounds, ours, NumPy by hand's and torch eager's,
    and our speed over each."""
    header = ["model", "batch", "cortado", "NumPy by hand", "torch eager", "cortado's speed / NumPy's", "/ torch's"]
    rows = [[row["sizes"] if row["case"] != "spirals" else f"spirals {row['sizes']}", str(row["batch"]),
             milliseconds(row["cortado_ms"]), milliseconds(row["numpy_ms"]), milliseconds(row["torch_ms"]),
             f"{row['speedup_vs_numpy']:.2f}x", f"{row['speedup_vs_torch']:.2f}x"] for row in results["rows"]]
    return markdown(header, rows)


def conv_layers_table(results):
    """``bench_conv_layers_gpu.py``: a row a layer, for each dtype and layout torch's cuDNN time over ours (above 1,
    ours is faster), forward / backward: ours fed NCHW against torch NCHW, ours fed channels last
    (``channels_last_io=True``) against torch fed channels last."""
    ratios = {}
    for case in results["cases"]:
        at = ratios.setdefault(case["layer"], {})
        at[case["dtype"], "NCHW", case["pass"]] = case["torch_nchw_over_ours"]
        at[case["dtype"], "channels last", case["pass"]] = case["torch_channels_last_over_ours_channels_last"]
    dtypes = list(dict.fromkeys(case["dtype"] for case in results["cases"]))
    columns = [(dtype, layout) for dtype in dtypes for layout in ("NCHW", "channels last")]
    rows = [[layer] + [" / ".join(f"{at[dtype, layout, p]:.2f}" for p in ("forward", "backward")
                                  if (dtype, layout, p) in at) for dtype, layout in columns]
            for layer, at in ratios.items()]
    return markdown(["layer"] + [f"{dtype} {layout}" for dtype, layout in columns], rows)


def norms_table(results):
    """``bench_norms_gpu.py``: a row a case and pass, our call's microseconds, the kernels it launches and their
    microseconds each timed alone, torch's call and its time over ours."""
    names = {"layer_norm": "layer norm", "cross_entropy": "cross-entropy"}
    header = ["case", "pass", "cortado us", "kernels", "their us", "torch us", "torch/ours"]
    rows = []
    for case in results["cases"]:
        ours, torch = case["contestants"]["cortado"], case["contestants"].get("torch")
        rows.append([f"{names.get(case['kind'], case['kind'])} {' x '.join(map(str, case['shape']))}",
                     case["pass"].replace("+", " + "), f"{ours['ms'] * 1e3:.1f}", str(ours["kernels"]),
                     f"{ours['kernel_ms'] * 1e3:.1f}", "" if torch is None else f"{torch['ms'] * 1e3:.1f}",
                     "" if torch is None else f"{ours['torch_over_ours']:.2f}"])
    return markdown(header, rows)


def embedding_gradient_table(results):
    """``bench_embedding_gradient_gpu.py``: a row a case, each contestant's microseconds a call, its time over the
    add_at's, and our programs' arenas."""
    names = ["cortado add_at", "cortado one-hot product", "torch embedding backward", "torch index_add_"]
    header = ["tokens x vocabulary x width", "dtype", *[f"{name} us" for name in names], "arena MiB (add_at / one-hot)"]
    rows = []
    for case in results["cases"]:
        cells = []
        for name in names:
            result = case["contestants"].get(name, {})
            cells.append("" if "ms" not in result else f"{result['ms'] * 1e3:.1f}" + (
                "" if name == names[0] else f" ({result['over_add_at']:.2f}x)"))
        arenas = [case["contestants"][name].get("arena_mib") for name in names[:2]]
        rows.append([f"{case['tokens']} x {case['vocabulary']} x {case['width']}", case["dtype"], *cells,
                     " / ".join("" if a is None else f"{a:.1f}" for a in arenas)])
    return markdown(header, rows)


def over_ours(peer, ours):
    """A peer's time over ours: the benchmark's own figure where it wrote one, else the wall clocks' where the peer
    was timed by the wall clock (jax), else the device times'; None without both."""
    if peer is None or ours is None:
        return None
    if "peer_over_ours" in peer:
        return peer["peer_over_ours"]
    if peer.get("timer", "").startswith("wall clock") and "wall_ms" in ours:
        return peer["wall_ms"] / ours["wall_ms"]
    return peer["ms"] / ours["ms"]


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


MAKERS = {"steps": steps_table, "norms": norms_table, "fused": fused_table, "int8": int8_table,
          "int8_requantized": int8_requantized_table,
          "float8": float8_table, "gelu": gelu_table,
          "data_parallel": data_parallel_table, "cpu_steps": cpu_steps_table,
          "conv_layers": conv_layers_table, "embedding_gradient": embedding_gradient_table}


def made(kind, path):
    """The table ``kind`` makes of results file ``path`` (under ``RESULTS``)."""
    if kind not in MAKERS:
        raise SystemExit(f"{PAGE.name}: no table of kind {kind!r} (known: {sorted(MAKERS)})")
    if not (RESULTS / path).is_file():
        raise SystemExit(f"{PAGE.name}: the {kind} table cites {path}, which is not in {RESULTS}")
    with open(RESULTS / path) as f:
        return MAKERS[kind](json.load(f))


def remade(page):
    """``page`` with every marked table made again from its file, and the (kind, path) of those that changed."""
    changed = []

    def again(match):
        table = made(match.group(2), match.group(3))
        if table != match.group(4):
            changed.append((match.group(2), match.group(3)))
        return match.group(1) + table + match.group(5)

    return MARKED.sub(again, page), changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table is stale")
    args = parser.parse_args()
    page = PAGE.read_text()
    new, changed = remade(page)
    for kind, path in changed:
        print(f"{'stale' if args.check else 'made again'}: the {kind} table of {path}")
    if args.check:
        sys.exit(1 if changed else 0)
    if changed:
        PAGE.write_text(new)


if __name__ == "__main__":
    main()
