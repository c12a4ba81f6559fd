"""gas: a GPU-aware scheduler extender for Kubernetes."""

__version__ = "0.1.0"
