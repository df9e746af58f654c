"""One task's life: the session and its collaborators (see ``piwork.run.session``)."""
