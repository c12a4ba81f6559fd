"""The HTTP server under gas's listeners: one asyncio loop (uvloop) holding every
connection, TLS through memory buffers, HTTP/1.1 (llhttp) and HTTP/2 (gas's framing), the
limits on what a peer may cost, and a pool of threads that answers a WSGI app. Knows nothing
of scheduling: `gas.serving` runs it in its gunicorn worker, `gas.node` for its metrics.
See docs/serving.md.
"""
