"""The API of ``smdistributed.dataparallel.tensorflow``, backed by Horovod.

A script written for SageMaker's data parallel library runs unchanged apart from
its import line::

    import training_toolkit.dataparallel.tensorflow as sdp

and is launched with ``mpirun`` (or the toolkit's MPI runner), on GPUs or CPUs.
Importing this module loads neither TensorFlow nor Horovod; ``init()`` does.  That
keeps the import cheap and free of side effects.  Every difference from the
library is listed in docs/dataparallel.md.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # annotations only: importing TensorFlow costs seconds
    import tensorflow as tf

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape", "DistributedOptimizer",
    "ReduceOp", "allreduce", "broadcast", "broadcast_global_variables", "broadcast_variables", "init",
    "local_rank", "local_size", "oob_allreduce", "overlap", "rank", "shutdown", "size", "NotSupportedError",
]


class NotSupportedError(ValueError):
    """An argument the data-parallel library documents as not supported (it raises too)."""


class Compression(enum.Enum):
    """How tensors travel during a reduction: unchanged, or floats cast to float16 (half the bytes)."""

    none = "none"
    fp16 = "fp16"


class ReduceOp(enum.Enum):
    """How the ranks' tensors combine.  Each value names the Horovod op that does it."""

    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"


def _as_python(fn: _F) -> _F:
    """Mark ``fn`` for tf.function's AutoGraph to call as plain Python instead of converting it.

    Converting would recurse into Horovod's code and cost seconds on every first trace.  The mark
    is the attribute ``tf.autograph.experimental.do_not_convert`` sets; setting it directly keeps
    TensorFlow unimported until init().
    """
    fn.autograph_info__ = None  # type: ignore[attr-defined]
    return fn


class _State:
    """All the module state the API needs. ``init()`` may run only once, and other calls only after it."""

    __slots__ = ("hvd", "shut_down")

    def __init__(self) -> None:
        self.hvd: Any = None  # horovod.tensorflow, once init() has run
        self.shut_down = False


_state = _State()


@_as_python
def init() -> None:
    """Start Horovod on whichever controller launched this process (MPI or Gloo). As in the library, only once."""
    if _state.shut_down:
        raise RuntimeError("init() called after shutdown(): smdistributed.dataparallel cannot restart in one process.")
    if _state.hvd is not None:
        raise RuntimeError("init() called more than once. smdistributed.dataparallel is already initialized.")
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:  # not installed, or built without TensorFlow
        raise ImportError("training_toolkit.dataparallel.tensorflow needs Horovod built with TensorFlow "
                          f"(HOROVOD_WITH_TENSORFLOW=1): {e}") from e
    hvd.init()
    _state.hvd = hvd


def _hvd() -> Any:
    """Horovod; before init() (Horovod not yet imported) or after shutdown(), an error saying which."""
    if _state.shut_down:
        raise RuntimeError("smdistributed.dataparallel was shut down: no calls are possible after shutdown().")
    if _state.hvd is None:
        raise RuntimeError("smdistributed.dataparallel is not initialized: call init() first.")
    return _state.hvd


@_as_python
def size() -> int:
    """Number of processes across all hosts (one per GPU, or per MPI slot on CPUs)."""
    return _hvd().size()


@_as_python
def local_size() -> int:
    """Number of processes on this host."""
    return _hvd().local_size()


@_as_python
def rank() -> int:
    """This process's rank among all processes, 0 to size() - 1; rank 0 is the leader."""
    return _hvd().rank()


@_as_python
def local_rank() -> int:
    """This process's rank on its host: the index of the GPU to pin."""
    return _hvd().local_rank()


def _op(op: ReduceOp | None, caller: str, allowed: Iterable[ReduceOp] = tuple(ReduceOp)) -> Any:
    """Horovod's op for ``op`` (None means AVERAGE, as documented), refusing those the library refuses."""
    op = ReduceOp.AVERAGE if op is None else op
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{caller}: op must be a ReduceOp member, not {op!r}")
    if op not in allowed:
        raise NotSupportedError(f"{caller}: op {op} is not supported; smdistributed.dataparallel supports only "
                                  f"{', '.join(str(a) for a in allowed)} here")
    return getattr(_hvd(), op.value)


def _compressor(compression: Compression | None, caller: str) -> Any:
    """Horovod's compressor for ``compression`` (None means none)."""
    compression = Compression.none if compression is None else compression
    if not isinstance(compression, Compression):
        raise TypeError(f"{caller}: compression must be Compression.none or Compression.fp16, not {compression!r}")
    return getattr(_hvd().Compression, compression.value)


def _no_devices(caller: str, device_dense: str, device_sparse: str) -> None:
    """The library refuses explicit reduction devices; so do we, so scripts stay portable back to it."""
    for name, value in (("device_dense", device_dense), ("device_sparse", device_sparse)):
        if value:
            raise NotSupportedError(f"{caller}: {name} is not supported by smdistributed.dataparallel "
                                      f"(got {value!r}); leave it empty")


def _tf_variable(value: Any) -> Any:
    """The tf.Variable inside a Keras 3 variable (``.value``), else ``value``: Horovod calls ``.ref()``.

    A tf.Variable's own ``value`` is a method, so tf.Variables and tensors pass through unchanged.
    """
    import tensorflow as tf

    inner = getattr(value, "value", None)
    return inner if isinstance(inner, tf.Variable) else value


@_as_python
def allreduce(tensor: tf.Tensor, param_index: int, num_params: int, compression: Compression = Compression.none,
              op: ReduceOp = ReduceOp.AVERAGE) -> tf.Tensor:
    """``tensor`` reduced over all ranks (averaged by default); same shape and dtype.

    ``param_index`` and ``num_params`` place the tensor in the library's fusion buckets.
    Horovod fuses tensors by itself, so they are accepted and unused.
    """
    return _hvd().allreduce(_tf_variable(tensor), compression=_compressor(compression, "allreduce"),
                            op=_op(op, "allreduce"))


@_as_python
def oob_allreduce(tensor: tf.Tensor, compression: Compression = Compression.none,
                  op: ReduceOp = ReduceOp.AVERAGE) -> tf.Tensor:
    """``tensor`` averaged over all ranks, e.g. to report a global loss. The library only supports AVERAGE here.

    The library documents a None return; this returns the averaged tensor, which is what the call is for.
    """
    return _hvd().allreduce(_tf_variable(tensor), compression=_compressor(compression, "oob_allreduce"),
                            op=_op(op, "oob_allreduce", (ReduceOp.AVERAGE,)))


@_as_python
def broadcast(tensor: tf.Tensor, root_rank: int) -> tf.Tensor:
    """``tensor`` as it is on ``root_rank``, on every rank."""
    return _hvd().broadcast(_tf_variable(tensor), root_rank)


@_as_python
def broadcast_variables(variables: Iterable[Any], root_rank: int) -> Any:
    """Assign every variable its value on ``root_rank``, so all ranks start from the same weights.

    Accepts tf.Variables and Keras 3 variables alike.  Returns None in eager code, and in
    graph (tf.compat.v1) code the op to run.
    """
    hvd = _hvd()
    return hvd.broadcast_variables([_tf_variable(v) for v in variables], root_rank)


@_as_python
def broadcast_global_variables(root_rank: int) -> Any:
    """The op that broadcasts every global variable from ``root_rank`` (graph mode: tf.compat.v1, estimators).

    Eager TensorFlow 2 keeps no global variables, so there this raises rather than silently doing nothing.
    """
    hvd = _hvd()
    import tensorflow as tf

    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() needs graph mode (tf.compat.v1 or tf.estimator); in eager "
                           "TensorFlow 2 code use broadcast_variables(model.variables, root_rank)")
    return hvd.broadcast_global_variables(root_rank)


@_as_python
def BroadcastGlobalVariablesHook(root_rank: int) -> Any:  # noqa: N802 - the library's name
    """A SessionRunHook that broadcasts all global variables from ``root_rank`` once the session exists.

    Horovod 0.28 defines its hook only when tf.estimator exists (gone since TensorFlow 2.16),
    so the hook is built here on tf.compat.v1.train.SessionRunHook.
    """
    hvd = _hvd()
    import tensorflow as tf

    class _BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
        def begin(self) -> None:  # once per graph: estimators build a new graph for each train() call
            self.op = hvd.broadcast_global_variables(root_rank)

        def after_create_session(self, session: Any, coord: Any) -> None:
            session.run(self.op)

    return _BroadcastGlobalVariablesHook()


@_as_python
def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",  # noqa: N802
                            compression: Compression = Compression.none, sparse_as_dense: bool = False,
                            op: ReduceOp = ReduceOp.AVERAGE) -> tf.GradientTape:
    """``gradtape`` whose ``gradient()`` averages the gradients over all ranks before returning them.

    Sources may be Keras 3 variables, and any nested structure that tf.GradientTape accepts.
    """
    hvd = _hvd()
    import tensorflow as tf

    _no_devices("DistributedGradientTape", device_dense, device_sparse)
    tape = hvd.DistributedGradientTape(gradtape, compression=_compressor(compression, "DistributedGradientTape"),
                                       sparse_as_dense=sparse_as_dense,
                                       op=_op(op, "DistributedGradientTape", (ReduceOp.AVERAGE,)))
    reduced_gradient = tape.gradient  # Horovod's: wants a flat list of tf.Variables (it calls .ref() on each)

    @_as_python
    def gradient(target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        flat = [_tf_variable(s) for s in tf.nest.flatten(sources)]
        grads = reduced_gradient(target, flat, output_gradients)
        if tf.UnconnectedGradients(unconnected_gradients) == tf.UnconnectedGradients.ZERO:
            grads = [tf.zeros_like(s) if g is None else g for g, s in zip(grads, flat)]
        return tf.nest.pack_sequence_as(sources, grads)

    # An instance attribute, not a subclass: Horovod's gradient() calls super(self.__class__, ...),
    # which would recurse forever under a further subclass.
    tape.gradient = gradient
    return tape


@_as_python
def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802
                         device_dense: str = "", device_sparse: str = "", compression: Compression = Compression.none,
                         sparse_as_dense: bool = False, op: ReduceOp = ReduceOp.AVERAGE,
                         bucket_cap_mb: int | None = None) -> Any:
    """``optimizer`` (a tf.compat.v1.train.Optimizer) averaging gradients over all ranks before applying them.

    Keras optimizers are refused: Horovod's Keras wrapper hooks a Keras 2 method that Keras 3
    never calls, so gradients would silently stay local.  Use DistributedGradientTape with them.
    ``bucket_cap_mb`` is checked as the library does, then unused: Horovod sizes its fusion
    buffer from HOROVOD_FUSION_THRESHOLD (bytes), read once at init().
    """
    hvd = _hvd()
    import tensorflow as tf

    _no_devices("DistributedOptimizer", device_dense, device_sparse)
    if bucket_cap_mb is not None and (bucket_cap_mb <= 0 or bucket_cap_mb * 1024 * 1024 % 128):
        raise ValueError(f"DistributedOptimizer: bucket_cap_mb * 1024 * 1024 must be a positive multiple of 128 bytes, "
                         f"got bucket_cap_mb={bucket_cap_mb!r}")
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a tf.compat.v1.train.Optimizer (tf.estimator / graph code), not "
                        f"{type(optimizer).__name__}; with Keras optimizers use DistributedGradientTape")
    return hvd.DistributedOptimizer(optimizer, name=name, use_locking=use_locking,
                                    compression=_compressor(compression, "DistributedOptimizer"),
                                    sparse_as_dense=sparse_as_dense,
                                    op=_op(op, "DistributedOptimizer", (ReduceOp.AVERAGE,)))


@_as_python
def overlap(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` itself. The library inserts an identity node that helps XLA overlap its allreduce with the
    backward pass; Horovod needs no hint: in a tf.function each gradient's allreduce may start once it exists."""
    _hvd()
    return tensor


@_as_python
def shutdown() -> None:
    """Stop Horovod. Optional at the end of a script; a second call does nothing."""
    if _state.shut_down:
        return
    _hvd().shutdown()
    _state.shut_down = True
