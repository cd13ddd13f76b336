"""The H100 runs' time per token, split: per-layer operators and all-reduce, each held against an
independent measurement of the same shapes on the same GPU.

    python benchmarks/simulator/h100_operators.py

The bundled H100 profile (LLMServingSim's v0 layout, Llama-3.1-70B, TP 4) times the Hugging Face
model's own operators with PyTorch hooks, eager: separate q, k, v and gate, up projections, an
RMSNorm and a rotary embedding each made of several elementwise kernels. vLLM runs fused kernels
(one QKV GEMM, one gate-up GEMM, fused RMSNorm with the residual add, fused rotary). Vidur's
profile of Llama-2-70B on the H100 at TP 4 (microsoft/vidur, MIT; ``data/``: its medians,
extracted) times the fused operators of a vLLM-derived model for the same layer shapes (hidden
8192, 64 heads, 8 KV heads, intermediate 28,672), and its network profile times NCCL all-reduce
on a DGX H100 (``torch.distributed``, eager: not vLLM's custom all-reduce under CUDA graphs).

Prints (1) the per-layer token-wise operators, the profile's against Vidur's, at batch sizes a
step runs; (2) the three H100 runs replayed with the profile's token-wise operators replaced by
Vidur's (attention, LM head, embedding and final norm left as profiled), with the catalogue's
all-reduce estimate and without all-reduce; (3) one step's all-reduce time at typical decode
batches, the catalogue's estimate against Vidur's NCCL measurement. A measurement of where the
H100 runs' error sits, not a change to the model.
"""

from __future__ import annotations

import bisect
import copy
import csv
from collections import defaultdict
from pathlib import Path
from statistics import mean

from fidelity_ablation import errors  # this script's folder is on sys.path

from narwhal.sim.profiles import store
from narwhal.sim.profiles.gpus import GPUS
from narwhal.sim.tensor_parallel import ALLREDUCES_PER_LAYER, allreduce_s
from narwhal.sim.validation.runlog import read_run

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
RUNS = HERE.parents[1] / "tests" / "data" / "runs" / "H100"
TP = 4
HIDDEN = 8192
LAYERS = 80
# the profile's operators (Hugging Face, unfused) -> Vidur's (fused), per layer; an operator
# vLLM fuses into another is priced at zero (its time is in the fused one)
FUSED = {
    "input_layernorm": "input_layernorm",
    "post_layernorm": "post_attention_layernorm",
    "q_proj": "attn_pre_proj",  # one QKV GEMM
    "k_proj": None,
    "v_proj": None,
    "rope": "attn_rope",
    "o_proj": "attn_post_proj",
    "gate_proj": "mlp_up_proj",  # one gate-up GEMM
    "up_proj": None,
    "act_fn": "mlp_act",
    "down_proj": "mlp_down_proj",
}
GROUPS = {
    "norms": ("input_layernorm", "post_layernorm"),
    "q,k,v": ("q_proj", "k_proj", "v_proj"),
    "rotary": ("rope",),
    "o": ("o_proj",),
    "gate,up": ("gate_proj", "up_proj"),
    "act": ("act_fn",),
    "down": ("down_proj",),
}


def vidur_operators() -> dict[str, list[list[float]]]:
    """Vidur's per-operator medians at TP 4: name -> [[tokens, seconds]] (duplicates averaged)."""
    seen: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with (DATA / "vidur-h100-llama2-70b-tp4-operators.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            tokens = int(row.pop("num_tokens"))
            for column, value in row.items():
                seen[column.removesuffix("_median_ms")][tokens].append(float(value) / 1e3)
    return {
        name: [[float(t), mean(values)] for t, values in sorted(points.items())]
        for name, points in seen.items()
    }


def at(points: list[list[float]], tokens: float) -> float:
    """Linear interpolation in a sorted [[size, seconds]] table (held flat past its ends)."""
    sizes = [p[0] for p in points]
    i = bisect.bisect_left(sizes, tokens)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (s0, t0), (s1, t1) = points[i - 1], points[i]
    return t0 + (t1 - t0) * (tokens - s0) / (s1 - s0)


def with_fused(profile: dict, vidur: dict[str, list[list[float]]]) -> dict:
    """The profile with its TP 4 token-wise layer operators replaced by Vidur's fused ones
    (plus Vidur's residual add, which the hooks did not time)."""
    out = copy.deepcopy(profile)
    dense = out["tp"][str(TP)]["dense"]
    for ours, theirs in FUSED.items():
        dense[ours] = vidur[theirs] if theirs else [[1.0, 0.0], [4096.0, 0.0]]
    dense["add"] = vidur["add"]
    return out


def vidur_allreduce() -> list[list[float]]:
    """Vidur's NCCL all-reduce medians over 4 H100s of a DGX: [[bytes, seconds]]."""
    with (DATA / "vidur-h100-dgx-allreduce-tp4.csv").open(newline="") as handle:
        rows = csv.DictReader(handle)
        return [[float(r["size_bytes"]), float(r["median_ms"]) / 1e3] for r in rows]


def with_measured_allreduce(profile: dict, allreduce: list[list[float]]) -> dict:
    """The profile with a per-layer operator holding a layer's two all-reduces as Vidur
    measured them (to be replayed with the catalogue's all-reduce estimate off)."""
    out = copy.deepcopy(profile)
    sizes = sorted({1, 2, 4, 8, *range(16, 4097, 16)})
    points = [[float(t), ALLREDUCES_PER_LAYER * at(allreduce, t * HIDDEN * 2)] for t in sizes]
    out["tp"][str(TP)]["dense"]["allreduce"] = points
    return out


def main() -> None:
    profile = store.bundled("H100", "meta-llama/Llama-3.1-70B")
    vidur = vidur_operators()
    dense = profile["tp"][str(TP)]["dense"]
    print("(1) one layer's token-wise operators, us: the profile's (hooks, unfused) / Vidur's")
    print(f"{'tokens':>7}" + "".join(f"{g:>16}" for g in GROUPS) + f"{'layer':>18}{'ratio':>7}")
    for tokens in (1, 16, 32, 48, 64, 128, 256, 512, 1024, 2048):
        cells, ours_total, theirs_total = [], 0.0, at(vidur["add"], tokens)
        for names in GROUPS.values():
            ours = sum(at(dense[n], tokens) for n in names)
            theirs = sum(at(vidur[FUSED[n]], tokens) for n in names if FUSED[n])
            ours_total, theirs_total = ours_total + ours, theirs_total + theirs
            cells.append(f"{1e6 * ours:7.1f}/{1e6 * theirs:<6.1f}")
        ratio = ours_total / theirs_total
        layer = f"{1e6 * ours_total:7.1f}/{1e6 * theirs_total:<7.1f}"
        print(f"{tokens:>7}" + "".join(f"{c:>16}" for c in cells) + f"{layer:>18}{ratio:>6.2f}x")
    print("    (Vidur's layer includes its residual add; the hooks did not time one)")

    fused = with_fused(profile, vidur)
    measured = vidur_allreduce()
    fused_nccl = with_measured_allreduce(fused, measured)
    print("\n(2) the H100 runs, mean errors (%): TTFT / TPOT / output tok/s")
    for run_dir in sorted(RUNS.iterdir()):
        run = read_run(run_dir)
        rows = {
            "as profiled": errors(run, profile),
            "Vidur's fused operators": errors(run, fused),
            "Vidur's, no all-reduce": errors(run, fused, allreduce=False),
            "Vidur's, Vidur's NCCL": errors(run, fused_nccl, allreduce=False),
            "as profiled, Vidur's NCCL": errors(
                run, with_measured_allreduce(profile, measured), allreduce=False
            ),
        }
        for label, figures in rows.items():
            cells = " / ".join(
                f"{figures[m]:+.1f}" for m in ("ttft_ms", "tpot_ms", "throughput_tok_s")
            )
            print(f"  {run_dir.name:<22}{label:<28}{cells}")

    gpu = GPUS["H100"]
    print("\n(3) all-reduces of one decode step (2 a layer x 80 layers), ms")
    print(f"{'decodes':>8}{'estimate':>10}{'Vidur NCCL':>12}")
    for decodes in (32, 48, 64, 96):
        nbytes = decodes * HIDDEN * 2
        steps = ALLREDUCES_PER_LAYER * LAYERS
        ours = steps * allreduce_s(nbytes, TP, gpu.allreduce_gbps, gpu.allreduce_latency_us / 1e6)
        theirs = steps * at(measured, nbytes)
        print(f"{decodes:>8}{1e3 * ours:>10.2f}{1e3 * theirs:>12.2f}")


if __name__ == "__main__":
    main()
