"""training_toolkit.dataparallel.tensorflow: smdistributed.dataparallel's TensorFlow API on Horovod.

The unit tests need neither TensorFlow nor MPI.  TestTwoRanks runs
test/fixtures/scripts/smddp_tf_train.py under ``mpirun -np 2`` with the python named by
TT_TF_PYTHON (default: this one), and skips when horovod.tensorflow does not import there.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time

import pytest

import training_toolkit.dataparallel.tensorflow as sdp

from helpers.paths import FIXTURES, REPO, TF_PYTHON

SRC = str(REPO / "src")
SCRIPT = FIXTURES / "smddp_tf_train.py"
NP = 2


def with_src(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the repo's src first on PYTHONPATH, so a python without the toolkit installed finds it."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)}


# -- no TensorFlow, no MPI ------------------------------------------------------------------------

def test_import_loads_nothing_heavy_and_changes_nothing():
    code = ("import json, os, sys; env = dict(os.environ); t = sys.modules.copy()\n"
            "import training_toolkit.dataparallel.tensorflow\n"
            "print(json.dumps({'heavy': sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'horovod', 'keras', 'numpy')), 'env_same': dict(os.environ) == env}))")
    out = subprocess.run([sys.executable, "-c", code], env=with_src(dict(os.environ)), capture_output=True,
                         text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == {"heavy": [], "env_same": True}


CALLS = {
    "size": lambda: sdp.size(),
    "local_size": lambda: sdp.local_size(),
    "rank": lambda: sdp.rank(),
    "local_rank": lambda: sdp.local_rank(),
    "allreduce": lambda: sdp.allreduce(1.0, 0, 1),
    "oob_allreduce": lambda: sdp.oob_allreduce(1.0),
    "broadcast": lambda: sdp.broadcast(1.0, 0),
    "broadcast_variables": lambda: sdp.broadcast_variables([], 0),
    "broadcast_global_variables": lambda: sdp.broadcast_global_variables(0),
    "BroadcastGlobalVariablesHook": lambda: sdp.BroadcastGlobalVariablesHook(0),
    "DistributedGradientTape": lambda: sdp.DistributedGradientTape(object()),
    "DistributedOptimizer": lambda: sdp.DistributedOptimizer(object()),
    "overlap": lambda: sdp.overlap(1.0),
    "shutdown": lambda: sdp.shutdown(),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_calls_before_init_raise(name):
    with pytest.raises(RuntimeError, match=r"not initialized: call init\(\) first"):
        CALLS[name]()


def test_compression_and_reduce_op_members():
    assert [c.name for c in sdp.Compression] == ["none", "fp16"]
    assert sdp.Compression.none is not sdp.Compression.fp16
    assert {op.name for op in sdp.ReduceOp} == {"AVERAGE", "SUM", "MIN", "MAX"}


@pytest.mark.parametrize("name, params", [
    ("allreduce", "tensor param_index num_params compression op"),
    ("oob_allreduce", "tensor compression op"),
    ("broadcast", "tensor root_rank"),
    ("broadcast_variables", "variables root_rank"),
    ("broadcast_global_variables", "root_rank"),
    ("BroadcastGlobalVariablesHook", "root_rank"),
    ("DistributedGradientTape", "gradtape device_dense device_sparse compression sparse_as_dense op"),
    ("DistributedOptimizer", "optimizer name use_locking device_dense device_sparse compression sparse_as_dense op "
                             "bucket_cap_mb"),
    ("overlap", "tensor"),
    ("init", ""), ("shutdown", ""), ("size", ""), ("local_size", ""), ("rank", ""), ("local_rank", ""),
])
def test_signatures_are_the_librarys(name, params):
    """Keyword calls written for the library must bind; defaults are Compression.none and ReduceOp.AVERAGE."""
    signature = inspect.signature(getattr(sdp, name))
    assert list(signature.parameters) == params.split()
    defaults = {k: p.default for k, p in signature.parameters.items()}
    assert defaults.get("compression", sdp.Compression.none) is sdp.Compression.none
    assert defaults.get("op", sdp.ReduceOp.AVERAGE) is sdp.ReduceOp.AVERAGE


# -- two ranks under mpirun ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Rank results of one ``mpirun -np 2`` run of the fixture script, with its wall time and model dir."""
    model_dir = tmp_path_factory.mktemp("model")
    env = with_src({**os.environ, "SM_MODEL_DIR": str(model_dir), "TF_CPP_MIN_LOG_LEVEL": "2"})
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(NP),
           "-x", "PYTHONPATH", "-x", "SM_MODEL_DIR", "-x", "TF_CPP_MIN_LOG_LEVEL", TF_PYTHON, str(SCRIPT)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=model_dir, env=env, capture_output=True, text=True, timeout=240)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = {}
    for f in model_dir.glob("rank-*.json"):
        info = json.loads(f.read_text())
        ranks[info["rank"]] = info
    print(f"mpirun -np {NP} {SCRIPT.name}: {wall:.1f} s wall")
    return {"ranks": ranks, "wall": wall, "model_dir": model_dir}


class TestTwoRanks:
    pytestmark = [pytest.mark.mpi, pytest.mark.tf_python]

    def test_every_rank_knows_its_place(self, run):
        ranks = run["ranks"]
        assert sorted(ranks) == list(range(NP))
        for r, info in ranks.items():
            assert (info["size"], info["local_size"], info["local_rank"]) == (NP, NP, r)

    def test_training_ends_with_identical_weights_and_a_falling_loss(self, run):
        ranks = run["ranks"]
        assert all(info["weights"] == ranks[0]["weights"] for info in ranks.values())
        # The losses are oob_allreduce averages, so every rank reports the same ones.
        assert {(info["first_loss"], info["last_loss"]) for info in ranks.values()} == {
            (ranks[0]["first_loss"], ranks[0]["last_loss"])}
        assert ranks[0]["last_loss"] < 0.5 * ranks[0]["first_loss"]
        assert list((run["model_dir"] / "checkpoint").glob("ckpt-1.index")), "rank 0 saved no checkpoint"

    def test_allreduce_ops(self, run):
        mine = [[r + 1.0, -10.0 * (r + 1)] for r in range(NP)]  # what each rank contributed
        expected = {
            "SUM": [sum(col) for col in zip(*mine)],
            "MIN": [min(col) for col in zip(*mine)],
            "MAX": [max(col) for col in zip(*mine)],
            "AVERAGE": [sum(col) / NP for col in zip(*mine)],
        }
        for info in run["ranks"].values():
            checks = info["checks"]
            assert checks["allreduce"] == expected
            assert checks["allreduce_default"] == expected["AVERAGE"]
            assert checks["allreduce_in_function"] == expected["SUM"]
            assert checks["oob_allreduce"] == [sum(range(NP)) / NP]

    def test_fp16_compression_round_trip(self, run):
        small = sum(0.1 * (r + 1) for r in range(NP)) / NP
        for info in run["ranks"].values():
            fp16 = info["checks"]["fp16"]
            assert fp16["dtype"] == "float32"  # decompressed back to the input's dtype
            assert fp16["values"][0] == pytest.approx(small, rel=1e-3)
            assert abs(fp16["values"][0] - small) > 1e-6  # travelled as float16, so not exact
            assert fp16["values"][1] == 1000.0 + (NP - 1) / 2

    def test_broadcast_and_overlap(self, run):
        for info in run["ranks"].values():
            assert info["checks"]["broadcast"] == [float(NP - 1)] * 3
            assert info["checks"]["overlap_is_identity"] is True

    def test_init_twice_raises_the_librarys_message(self, run):
        for info in run["ranks"].values():
            assert info["checks"]["init_twice"] == (
                "RuntimeError: init() called more than once. smdistributed.dataparallel is already initialized.")

    def test_unsupported_arguments_raise_clearly(self, run):
        for info in run["ranks"].values():
            checks = info["checks"]
            for key in ("device_dense", "tape_sum", "oob_max"):
                assert checks[key].startswith("NotSupportedError: ") and "not supported" in checks[key], checks[key]
            assert checks["keras_optimizer"].startswith("TypeError: DistributedOptimizer wraps a "
                                                        "tf.compat.v1.train.Optimizer")
            assert checks["global_variables_eager"].startswith("RuntimeError: broadcast_global_variables() needs "
                                                               "graph mode")
            assert checks["after_shutdown"] == ("RuntimeError: smdistributed.dataparallel was shut down: no calls "
                                                "are possible after shutdown().")

    def test_graph_mode_optimizer_and_broadcast_hook(self, run):
        graphs = [info["checks"]["graph"] for info in run["ranks"].values()]
        assert all(g["weights"] == graphs[0]["weights"] for g in graphs)
        assert all(g["last_loss"] < 0.5 * g["first_loss"] for g in graphs)
