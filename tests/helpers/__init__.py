"""Helpers shared by the tests: the one place a test module imports test code from.

A test module (``test_*.py``) never imports another test module or a
``conftest.py``: what two modules share lives here (plain functions, classes,
constants) or in a ``conftest.py`` as a fixture, which pytest hands to every
test below it. ``tests/unit/test_test_layout.py`` checks this rule.

* ``vm``: a real VM's task dirs, models.json, config, scripted prompts and askers.
* ``cli``: ``piwork`` as a subprocess (its --json events, a private home).
* ``procs``: the host's process table (alive, parents, QEMU children).
* ``faults``: the fault suite's shared task story and its after-fault checks.
* ``hosts``: a real sshd on loopback for the remote-host tests.
* ``gui``: waiting on the qasync loop, keys, the checkpoints tree.
* ``images``, ``pack``, ``policy``, ``checkpoints``, ``changes``, ``disk``: small builders
  (``changes``: the agent's layer as a dict or a directory, and a judge).
* ``fake_agent``, ``guest_double``, ``mux_guest``: test doubles of the VM side for unit
  tests (never for a test that claims the VM works); ``oci_archive``,
  ``holder`` (run as ``python -m tests.helpers.holder``).
"""
