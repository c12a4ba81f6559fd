"""A stateful, in-process double of the Kubernetes API server for integration tests.

The double speaks real HTTP/1.1 on 127.0.0.1 so that the real ``kubernetes`` Python
client (possibly in another process) can talk to it.  It models the parts of core/v1
the extender uses: nodes, pods (incl. ``/status`` and ``/binding``), events, list and
watch with resourceVersion semantics, paginated lists (``limit``/``continue``), selectors,
patches and ``kind: Status`` errors, following the real kube-apiserver's rules and messages.

Typical pytest fixture::

    @pytest.fixture
    def apiserver(tmp_path):
        with ApiServerDouble() as double:
            double.kubeconfig_path = double.write_kubeconfig(tmp_path / "kubeconfig")
            yield double

    def test_something(apiserver):
        api = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(config_file=apiserver.kubeconfig_path)
        )
        apiserver.add_node({"metadata": {"name": "n1"}})
        assert api.list_node().items[0].metadata.name == "n1"

Everything the tests read back (``get_pod``, ``list_nodes``, ``events`` ...) is a deep
copy; stored objects are never mutated in place (every write stores a new dict), so
they can be shared with watch streams without copying.

The modules, along the double's seams: ``store`` (objects, resource versions, watch
history, compaction, the real server's write rules), ``kinds`` and ``selectors`` (the
resources served, label and field selectors), ``paging`` (continue tokens and pages at a
snapshot), ``patches`` (merge, strategic, JSON),
``errors`` (``kind: Status`` bodies), ``faults`` (injected failures and delays), ``rbac``
(an optional authorizer), ``routes`` and ``server`` (the HTTP layer: routes, handlers,
watch streaming, the server thread) and ``double`` (``ApiServerDouble`` itself).
"""

from tests.support.apiserver.double import ApiServerDouble
from tests.support.apiserver.errors import ApiError, JSONDict
from tests.support.apiserver.faults import FaultInjector, FaultRule
from tests.support.apiserver.rbac import (
    RbacGrant,
    RbacRequest,
    rbac_grants_from_manifests,
    rbac_request,
)

__all__ = [
    "ApiError",
    "ApiServerDouble",
    "FaultInjector",
    "FaultRule",
    "JSONDict",
    "RbacGrant",
    "RbacRequest",
    "rbac_grants_from_manifests",
    "rbac_request",
]
