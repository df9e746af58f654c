"""The desktop app: a PySide6 window over the runner API (``piwork.runner``).

Nothing here reaches into ``piwork.vm`` or ``piwork.rpc``: the window drives
tasks through ``TaskSession`` and reads the stores through their public
functions. Modules that import Qt are imported lazily so the headless CLI works
on a machine without PySide6.
"""
