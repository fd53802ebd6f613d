"""``python -m training_toolkit.rank -- CMD...``: what every MPI rank runs before the user's script.

mpirun forwards one environment to every rank; a few of its variables are
host-specific (``SM_CURRENT_HOST``, ``SM_TRAINING_ENV``, ``SM_NUM_GPUS``...).
The reference forwards the first host's values, so every rank believes it runs
there.  Here each rank rebuilds the contract from its own host's ``/opt/ml``,
lays it over what mpirun forwarded, moves into its host's code dir and
``exec``s the command: no extra process stays between mpirun and the script.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from training_toolkit.names import TORCH_MASTER_PORT


def torch_style_variables(environ: Mapping[str, str], master: str) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE... from Open MPI's own, for libraries that read torch's names."""
    mapping = {"RANK": "OMPI_COMM_WORLD_RANK", "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
               "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE", "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE"}
    out = {ours: environ[theirs] for ours, theirs in mapping.items() if theirs in environ and ours not in environ}
    if out:
        out.setdefault("MASTER_ADDR", environ.get("MASTER_ADDR", master))
        out.setdefault("MASTER_PORT", environ.get("MASTER_PORT", str(TORCH_MASTER_PORT)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    base_dir = None
    if len(args) >= 2 and args[0] == "--base-dir":
        base_dir, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("usage: python -m training_toolkit.rank [--base-dir DIR] -- COMMAND...\n")
        return 64
    from training_toolkit import contract, hardware, job, settings
    from training_toolkit.errors import ToolkitError
    from training_toolkit.log import log
    from training_toolkit.paths import Paths

    environ = dict(os.environ)
    try:
        config = settings.parse(environ, base_dir=base_dir)
        paths = Paths.at(config.base_dir)
        spec = job.load_job(paths, environ, hardware.probe(config.num_gpus))
    except ToolkitError as exc:
        log(f"rank: {exc}")
        return exc.exit_code
    env = contract.script_environment(spec, environ, torch_style_variables(environ, contract.master_host(spec)))
    try:
        os.chdir(paths.code_dir)
    except OSError:
        pass
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        log(f"rank: cannot run {args[0]}: {exc}")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
