"""The attributes a WSGI app served by the serving loop may carry, to be answered faster or
to see what the loop counts. An app without them is served as any WSGI app."""

from __future__ import annotations

DIRECT_POST = "gas_direct_post"
"""The attribute under which a WSGI app served by the serving loop offers the POSTs the
server answers without a WSGI environ (`gas.httpserver.direct.DirectPost`)."""

SERVING_STATS = "gas_serving_stats"
"""The attribute under which a WSGI app served by the serving loop takes the serving loop's
counters (`gas.httpserver.stats.ServingStats`, a Prometheus collector) once, at start."""

CONNECTION_OPENED = "gas_connection_opened"
"""The attribute under which a WSGI app served by the serving loop takes note of each
connection whose handshake completed: a callable given the protocol it chose ("h2" or
"http/1.1")."""
