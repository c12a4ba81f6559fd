"""Generated kubelet API modules of the DRA way; see the .proto files beside them."""
