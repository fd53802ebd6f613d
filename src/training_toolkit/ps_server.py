"""``python -m training_toolkit.ps_server``: a TensorFlow parameter server owned by the toolkit.

It reads its task from ``TF_CONFIG`` and serves until it is stopped.  It runs
on the CPU only (``CUDA_VISIBLE_DEVICES`` is cleared by the runner), so it
never takes a GPU from the training processes.
"""

from __future__ import annotations

import json
import os

from training_toolkit.log import log


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
