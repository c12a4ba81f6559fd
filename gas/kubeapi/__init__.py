"""The calls gas makes to the API server, shared by the extender (`gas serve`) and the node
agent (`gas node`): the core/v1 and Lease calls named as the generated client's, the paged
list (of the extender's reflectors and `gas inspect`), prepared requests for the bind path,
and the Event sender.

Every call goes through the official client's `ApiClient` (configuration, credentials, TLS,
connection pool) but none through its generated API classes: importing `CoreV1Api` loads a
63,000-line module and some 250 pydantic models, about 21 MiB that no gas process needs,
since gas reads every answer as plain JSON.
"""
