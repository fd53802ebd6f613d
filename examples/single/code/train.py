"""A tiny training script in the SageMaker style: reads its job from SM_* and argv."""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--learning-rate", type=float, default=0.1)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN", "data"))
args = parser.parse_args()

# Fit y = 2x + 1 by gradient descent on the training channel's points.
with open(os.path.join(args.train, "points.json")) as f:
    points = json.load(f)
w, b = 0.0, 0.0
for epoch in range(args.epochs):
    gw = sum((w * x + b - y) * x for x, y in points) / len(points)
    gb = sum((w * x + b - y) for x, y in points) / len(points)
    w, b = w - args.learning_rate * gw, b - args.learning_rate * gb
    loss = sum((w * x + b - y) ** 2 for x, y in points) / len(points)
    if (epoch + 1) % 50 == 0 or epoch == 0:
        print(f"epoch {epoch + 1}/{args.epochs} loss={loss:.5f}", flush=True)

os.makedirs(args.model_dir, exist_ok=True)
with open(os.path.join(args.model_dir, "model.json"), "w") as f:
    json.dump({"w": w, "b": b, "host": os.environ.get("SM_CURRENT_HOST")}, f)
print(f"saved model w={w:.3f} b={b:.3f} to {args.model_dir}")
