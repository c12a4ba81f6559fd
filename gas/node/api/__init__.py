"""Generated kubelet API modules; see the .proto files beside them."""
