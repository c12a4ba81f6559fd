"""The node side's one error type."""

from __future__ import annotations


class NodeError(Exception):
    """A failure with a message fit for the user (a missing library, an unreadable sysfs
    tree, a kubeconfig that cannot be loaded); commands log it and exit with status 1."""
