"""This host's ssh part of an MPI job (runners/mpi_ssh.py): what it tells the others about itself."""

from training_toolkit.config.settings import parse
from training_toolkit.runners.mpi_ssh import INTRO_CLIENT_KEY, INTRO_HOST_KEY, SshPart


def test_a_host_introduces_itself_with_the_same_keys_for_the_whole_job():
    """It introduces itself to every lead it joins (``Membership.introduce``): new keys would fail the new lead's
    logins (host key verification) and the others' admission of its client key."""
    part = SshPart("algo-2", parse({}), {})
    first = part.introduction()
    assert set(first) == {INTRO_CLIENT_KEY, INTRO_HOST_KEY} and first[INTRO_CLIENT_KEY] != first[INTRO_HOST_KEY]
    assert part.introduction() == first
    assert SshPart("algo-2", parse({}), {}).introduction() != first  # each train its own, random per job
