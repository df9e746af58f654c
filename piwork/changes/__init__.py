"""Change sets: the person's folder is written only by piwork (docs/change-sets.md).

The guest sees the working folder read-only under a writable layer of its own;
what it changed there arrives on the host as a change set, untrusted input
that is validated (``entry``, ``wire``), compared with the folder, decided from
its effect (``holds``: what waits for the person; the host policy and the
person for deletes and moves), checkpointed (``journal``, ``store``) and
applied three-way (``engine``, ``folder``), for a local VM and a ``--host`` one
alike (``sources``). ``history`` is the folder's history for ``piwork changes``
/ ``undo`` (re-exported by ``piwork.checkpoints``); ``api`` is what waits for
the person and their answer (``piwork apply``, the app).

Nothing is imported here: submodules are imported by name (``piwork.policy``
reads ``holds`` while it loads).
"""
