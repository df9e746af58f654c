"""Remote hosts over SSH: a task's VM on a Linux box with KVM, everything else here.

Keys, policy, tasks and the folder stay on this machine; only QEMU, the pack
and a small watchdog go to the remote (docs/scale-out.md, issue 21).
"""
