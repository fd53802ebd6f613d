"""A TensorFlow parameter server owned by the toolkit, run as a file by the user's interpreter.

It imports TensorFlow, which lives with the user's interpreter (``TRAINING_TOOLKIT_PYTHON``),
not necessarily with the toolkit's, so the runner starts this file with that interpreter and it
imports nothing of the toolkit.  It reads its task from ``TF_CONFIG`` and serves until it is
stopped.  It runs on the CPU only (``CUDA_VISIBLE_DEVICES`` is cleared by the runner), so it
never takes a GPU from the training processes.
"""

from __future__ import annotations

import json
import os
import sys


def log(message: str) -> None:
    """As ``training_toolkit.core.log.log`` writes (this file cannot import the toolkit)."""
    print(f"training-toolkit: {message}", file=sys.stderr, flush=True)


def main() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    import tensorflow as tf  # deferred: only this process needs it

    server = tf.distribute.Server(
        tf.train.ClusterSpec(config["cluster"]), job_name=task["type"], task_index=task["index"],
        protocol="grpc", start=True,
    )
    log(f"parameter server {task['type']}:{task['index']} serving at {server.target}")
    server.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
