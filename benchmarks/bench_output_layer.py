"""The mask-aware output layer of Gemma 3 270M: projecting only the allowed tokens' rows against the full projection,
as the allowed set grows; where the two cross sets ``SPARSE_SHARE`` in constrain/integrations/transformers_model.py.

Run: .venv/bin/python benchmarks/bench_output_layer.py [--repeats 15] [--threads 2]

For each size k (random allowed ids, sorted, as a mask gives them), one decoder hidden state is projected by
``TransformersModel``'s own output-layer code: the gathered rows (``sparse``) and the whole ``lm_head`` (``full``);
the two alternate, ``--repeats`` times each. Printed: median and p90 milliseconds of each, their ratio, and the
largest k where the sparse path is still faster by the median.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch

from constrain.integrations.transformers_model import TransformersModel
from constrain.models.gemma import load_default_model

SIZES = (1, 16, 256, 4096, 16384, 65536, 131072, 196608, 262144)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = TransformersModel(*load_default_model())
    width = model.logits_width
    hidden = model.model.get_decoder()(input_ids=torch.tensor([model.encode("A hidden state")])).last_hidden_state
    hidden = hidden[:, -1, :].detach()
    rng = np.random.default_rng(0)
    print(
        f"Gemma 3 270M output layer ({width:,} x {hidden.shape[-1]}, float32), {args.threads} threads; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n"
    )
    print("| allowed tokens | share | sparse median ms | p90 | full median ms | p90 | sparse / full |")
    print("|---|---|---|---|---|---|---|")
    crossover = 0
    with torch.inference_mode():
        for k in SIZES:
            ids = np.sort(rng.choice(width, k, replace=False))
            sparse, full = [], []
            for _ in range(args.repeats):
                began = time.perf_counter()
                model._project(hidden, [ids])
                sparse.append(time.perf_counter() - began)
                began = time.perf_counter()
                model._project(hidden, [None])
                full.append(time.perf_counter() - began)
            s, f = np.median(sparse) * 1e3, np.median(full) * 1e3
            if s < f:
                crossover = k
            print(
                f"| {k:,} | {k / width:.1%} | {s:.2f} | {np.percentile(sparse, 90) * 1e3:.2f} | {f:.2f} | "
                f"{np.percentile(full, 90) * 1e3:.2f} | {s / f:.2f} |"
            )
    print(f"\nsparse is faster up to {crossover:,} allowed tokens ({crossover / width:.0%} of the rows) by the median")


if __name__ == "__main__":
    main()
