"""One task's life, below every front end (the runner's home as it is split up; see
ARCHITECTURE.md). Nothing here imports Qt or a front end."""
