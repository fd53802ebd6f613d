"""What tests share: paths, job trees, skip rules, local-cluster runs, and the reference harness.

Import as ``from helpers.jobs import write_job``; pytest puts ``test/`` on ``sys.path``
(it holds the rootdir ``conftest.py``), so ``helpers`` is found from every test package.
"""
