"""piwork: a host controller for a VM-sandboxed coding agent."""

__version__ = "0.1.0"
