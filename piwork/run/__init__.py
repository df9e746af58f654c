"""One task's life, below every front end: the session and its collaborators (see
``piwork.run.session``). Nothing here imports Qt or a front end."""
