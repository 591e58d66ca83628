"""Do XLA compiles in threads overlap? MiniLM shapes compiled with 1, 2 and 3 threads.

    python bench/compile_threads.py             # 6 shapes per setting, 2 repetitions

Each setting compiles its own 6 distinct shapes (so no cache of any kind serves them) of
the embed_text encoder, with ``BackgroundCompile`` on 1, 2 or 3 threads, and prints the
wall time, the process CPU time and their ratio (above 1: compiles ran in parallel). The
settings take turns, so other load on the machine hits them alike; the load average is
printed with each line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", default="1,2,3")
    args = parser.parse_args(argv)

    import numpy as np

    from beam_jax._src.kernel.precompile import BackgroundCompile
    from beam_jax.internal import Kernel
    from beam_jax.text import SentenceEncoder

    encoder = SentenceEncoder.from_dir()
    kernel = Kernel(encoder.element_fn)
    params = kernel.put_params(encoder.load_params())
    treedef = __import__("jax").tree_util.tree_structure({"input_ids": 0})

    def shapes(offset: int):
        return [([((b + offset, length), np.int32)], ("L",)) for length in (24, 48, 96)
                for b in (8, 32)]  # fmt: skip

    BackgroundCompile(kernel, params, shapes(0), treedef, threads=1).wait()  # warm tracing
    offset = 1
    for rep in range(args.repeat):
        for n in (int(t) for t in args.threads.split(",")):
            wall, cpu = time.perf_counter(), time.process_time()
            BackgroundCompile(kernel, params, shapes(offset), treedef, threads=n).wait()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            offset += 1
            print(
                f"round {rep + 1}, {n} thread(s): 6 shapes in {wall:.2f} s wall, {cpu:.2f} s "
                f"CPU (CPU/wall {cpu / wall:.2f}); load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
