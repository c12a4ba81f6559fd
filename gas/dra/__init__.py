"""`gas dra`: the node side of the DRA way. It publishes this node's cards in a
ResourceSlice, each card shareable with consumable capacity, and serves the kubelet's DRA
plugin API, preparing each claim as a CDI spec of the card it was allocated.

Pure parts: `driver` (names), `slices` (the slice from the cards), `claims` (what a claim's
allocation asks of this node), `cdi` (the CDI spec of a claim), `state` (the prepared
claims as records). I/O: `pcifacts` (the PCI facts discovery does not read), `files`
(atomic writes, the state file), `publish` (the slice on the API server), `preparer`
(prepare and unprepare), `plugin` (the gRPC services and their sockets), `agent` (the
process), `command` (its flags, importable without grpcio).
"""
