"""The train stage with a captured update on the CPU whose replay of one batch shape raises, as a
CUDA replay can (graphs.py's seam: helpers/graphs.py's CpuGraphs, with the Learner built as
Learner(graphs=True) builds it on CUDA). The first shape captured in each process fails: the
first restart runs that shape eagerly, the second every shape (test_preempt.py).

    python -m transformer.launch --standalone --nproc_per_node=1 \\
        -m helpers.captured_train SHARDS TOKENIZER CKPT_DIR --resume
"""

from __future__ import annotations

from helpers.graphs import CpuGraphs
from transformer import train
from transformer.core import dist, failure


class FirstReplayFails(CpuGraphs):
    """CpuGraphs whose first capture's replay raises, before it runs anything."""

    def capture(self, update, inputs):
        replay = super().capture(update, inputs)
        if self.graphs:  # another shape captured before: that one failed already
            return replay

        def broken():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return broken


_learner, _path = train.Learner, train.update_path


def captured_learner(*args, graphs: bool = False, **kwargs):
    le = _learner(*args, graphs=False, **kwargs)
    if graphs:  # as Learner(graphs=True) sets them on CUDA
        le.graphs, le.keep_grads, le.autocast_cache = FirstReplayFails(), True, False
    return le


def captured_path(tcfg, device, precision):
    """update_path's, with static shapes captured on the CPU as on CUDA."""
    path = _path(tcfg, device, precision)
    return {**path, "graphs": path["static"] and tcfg.graphs == "auto"}


train.Learner, train.update_path = captured_learner, captured_path

if __name__ == "__main__":
    dist.run(failure.recorded("train", train.main))
