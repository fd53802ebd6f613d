"""training-toolkit: the entry point that runs inside a training container.

It reads the job from ``/opt/ml``, decides how this host takes part, runs the
user's script with the environment SageMaker scripts expect, and ends every host
with the same verdict.  Importing the package has no side effects.
"""

__version__ = "0.1.0"
