"""docs/benchmarks.md's generated tables: each the one its results file makes (``benchmarks/tables.py``), and the
maker's figures those of the file: ours, each peer's time with its time over ours, the GEMM floor, the memory."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tables  # noqa: E402


def test_every_generated_table_of_the_page_is_the_one_its_results_file_makes():
    page = tables.PAGE.read_text()
    remade, changed = tables.remade(page)
    assert changed == [], f"stale tables (python benchmarks/tables.py makes them again): {changed}"
    assert remade == page
    assert len(tables.MARKED.findall(page)) >= 5


def _run(**contestants):
    case = {"size": "tiny", "layers": "8-8", "batch": 4, "dtype": "bfloat16", "contestants": contestants,
            "memory": {"ours_bytes": 3 << 20, "torch_bytes": 6 << 20}}
    return {"cases": [case], "notes": {"torch.compile": "mode='reduce-overhead', fullgraph=True"}}


def test_a_steps_table_puts_ours_first_and_each_peers_time_over_ours_beside_it():
    table = tables.steps_table(_run(
        jax={"ms": 30.0, "wall_ms": 40.0, "timer": "wall clock until block_until_ready"},
        torch={"ms": 150.0, "timer": "cuda events (torch)"},
        cortado={"ms": 12.5, "wall_ms": 20.0},
        **{"torch.compile": {"ms": 25.0, "peer_over_ours": 1.9},
           "cortado (heuristic GEMMs)": {"ms": 13.0}}))
    header, rule, row = table.splitlines()
    assert header == ("| case | dtype | cortado | cortado, heuristic GEMMs | torch eager | torch.compile (reduce-overhead) "
                      "| jax.jit | peak MiB (ours / torch eager) |")
    assert rule.count("---") == 8
    # torch by device times, torch.compile as its benchmark wrote it, jax by the wall clocks
    assert row == ("| 8-8, batch 4 | bfloat16 | 12.50 ms | 13.00 ms | 150.0 ms (12.00x) | 25.00 ms (1.90x) "
                   "| 30.00 ms (2.00x) | 3 / 6 |")


def test_a_peer_missing_from_a_case_leaves_its_cell_empty_and_an_unknown_kind_is_named():
    run = _run(cortado={"ms": 1.0}, torch={"ms": 2.0})
    run["cases"].append({**run["cases"][0], "contestants": {"cortado": {"ms": 1.5}}, "gemm_floor": {"ms": 1.25}})
    rows = tables.steps_table(run).splitlines()[2:]
    assert rows[0].endswith("| 1.000 ms | 2.000 ms (2.00x) |  | 3 / 6 |")
    assert rows[1].endswith("| 1.500 ms |  | 1.250 ms | 3 / 6 |")
    with pytest.raises(SystemExit, match="no table of kind 'bars'"):
        tables.made("bars", "h200/gpt_gpu.json")
    with pytest.raises(SystemExit, match="cites h200/none.json, which is not in"):
        tables.made("steps", "h200/none.json")


def test_a_norms_table_gives_each_call_its_kernels_and_torchs_time_over_ours():
    run = {"cases": [{"kind": "layer_norm", "shape": [8192, 768], "pass": "forward+backward", "contestants": {
        "cortado": {"ms": 0.0791, "kernels": 3, "kernel_ms": 0.058, "torch_over_ours": 1.94},
        "torch": {"ms": 0.1535}}}]}
    row = tables.norms_table(run).splitlines()[2]
    assert row == "| layer norm 8192 x 768 | forward + backward | 79.1 | 3 | 58.0 | 153.5 | 1.94 |"


def test_a_data_parallel_table_has_a_column_for_each_world_size_the_run_measured():
    def run(ms, efficiency, over=None):
        return {"ms": ms, "samples_per_s": 1000.0 / ms, "scaling_efficiency": efficiency,
                **({} if over is None else {"over_ddp": over})}

    results = {"models": {"mlp": {"dtype": "bfloat16", "batch_per_gpu": 8192}}, "results": {"mlp": {
        "cortado": {"1": run(10.0, 1.0, 1.1), "2": run(10.5, 0.952, 1.2), "8": run(11.0, 0.909, 1.25)},
        "torch DDP": {"1": run(11.0, 1.0), "2": run(12.0, 0.917), "8": run(13.75, 0.8)}}}}
    header, _, ours, ddp = tables.data_parallel_table(results).splitlines()
    assert header == ("| model | contestant | 1 GPU ms/step | 2 GPUs ms/step | 8 GPUs ms/step | samples/s on 8 "
                      "| efficiency on 2 / 8 | ours / DDP on 2 / 8 |")
    assert ours == ("| MLP 8192x3, bfloat16, batch 8192 a GPU | cortado | 10.00 | 10.50 | 11.00 | 91 | 0.952 / 0.909 "
                    "| 1.20 / 1.25 |")
    assert ddp == "|  | torch DDP | 11.00 | 12.00 | 13.75 | 73 | 0.917 / 0.800 |  |"
