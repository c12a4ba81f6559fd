"""Hostile input: fuzzing the request decoders over real HTTP, and every label and
annotation parser in-process.

Over HTTP (a real `gas serve` with mutual TLS against the API-server double), every input
must get a 4xx or a well-formed reply: a filter reply names each input node exactly once,
a bind reply carries `Error`; never a 5xx, never a hang. Afterwards gas still serves and its
ledger is unchanged. Slow clients must not be able to hold gas's threads.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gas.core import model
from gas.core.quantity import MAX_QUANTITY, QuantityError, parse_quantity
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import gas_serving, ledger_of
from tests.support.objects import gpu_node, gpu_pod

MAX_BODY = 256 * 1024
THREADS = 4
REPLY_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
NODES = ["two-cards", "four-cards", "cpu-only"]

# Inputs fuzzed, per target; printed at the end of the module (pytest -s shows it).
COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print("\ninputs fuzzed:", json.dumps(dict(sorted(COUNTS.items()))))


@pytest.fixture(scope="module")
def cluster() -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as api:
        api.add_node(gpu_node("two-cards", "0.1", i915="2", memory_max="16Gi"))
        api.add_node(gpu_node("four-cards", "0.1.2.3", i915="4", memory_max="32Gi"))
        api.add_node({"metadata": {"name": "cpu-only"}, "status": {"allocatable": {"cpu": "4"}}})
        placed = gpu_pod("placed", node="two-cards", phase="Running")
        placed["metadata"]["annotations"] = {model.ANNOTATION_CARDS: "card1"}
        api.add_pod(placed)
        yield api


@pytest.fixture(scope="module")
def server(
    cluster: ApiServerDouble, tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GasProcess]:
    directory = tmp_path_factory.mktemp("gas-fuzz")
    args = [
        "--maxRequestBytes",
        str(MAX_BODY),
        "--threads",
        str(THREADS),
        "--enableAllowlist",
        "--enableDenylist",
    ]
    with gas_serving(cluster, directory, tls_files, args, NODES) as process:
        yield process


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def post_raw(server: GasProcess, path: str, body: bytes, **headers: str) -> requests.Response:
    return server.session.post(
        server.url + path,
        data=body,
        headers={"Content-Type": "application/json", **headers},
        timeout=20,
    )


def check_reply(path: str, body: Any, response: requests.Response) -> None:
    """The contract: a 4xx with a JSON Error, or a well-formed 200 reply."""
    status = response.status_code
    assert status < 500, f"{status} for {path}: {response.text[:500]}"
    reply = _strict_json(response.text)
    assert isinstance(reply, dict)
    if status != 200:
        assert 400 <= status < 500
        assert isinstance(reply.get("Error"), str) and reply["Error"]
        return
    if path.endswith("/bind"):
        assert set(reply) == {"Error"} and isinstance(reply["Error"], str)
        return
    assert set(reply) == REPLY_KEYS
    assert reply["Error"] == ""
    args: dict[str, Any] = {}
    for key, value in body.items() if isinstance(body, dict) else ():
        if key.lower() not in args or key[:1].isupper():  # as gas: exact case wins
            args[key.lower()] = value
    if args.get("nodenames") is not None:
        names = list(args["nodenames"])
    else:
        names = [item["metadata"]["name"] for item in args["nodes"]["items"]]
    answered = (
        list(reply["NodeNames"])
        + list(reply["FailedNodes"])
        + list(reply["FailedAndUnresolvableNodes"])
    )
    assert sorted(answered) == sorted(set(names)), "every input node exactly once"
    for reasons in (reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]):
        assert all(isinstance(r, str) and r and "%" not in r for r in reasons.values())


def test_pod_metadata_that_is_not_an_object_is_no_500(server: GasProcess) -> None:
    """Regression (found by the fuzzer): a pod whose metadata is a list crashed the
    no-fit Event path with AttributeError, a 500."""
    spec = gpu_pod("x", {"name": "a", "resources": {"limits": {"gpu.intel.com/i915": "63"}}})
    for metadata in ([1, 2], "meta", 7, {"name": ["n"], "namespace": 3}):
        body = {"Pod": {"metadata": metadata, "spec": spec["spec"]}, "NodeNames": NODES}
        response = post_raw(server, "/scheduler/filter", json.dumps(body).encode())
        check_reply("/scheduler/filter", body, response)
        assert response.json()["NodeNames"] == []
        COUNTS["http filter (hand-written)"] += 1


# ------------------------------------------------------------------ strategies

ABSURD_QUANTITIES: list[Any] = [
    "1e400",
    "-1",
    "NaN",
    "Infinity",
    "-Infinity",
    "1.5",
    "9223372036854775808",
    "1e18",
    "99999999999999999999Ei",
    "0.0000001",
    "1Ki",
    "",
    " ",
    "1 ",
    "\uff11",
    "0x10",
    "1e-3",
    "+1",
    "1m",
    "1E3",
    "1e999999",
    1,
    -1,
    1.5,
    10**30,
    True,
    None,
    [],
    {},
    float("nan"),
    float("inf"),
]
RESOURCES = [
    "gpu.intel.com/i915",
    "gpu.intel.com/xe",
    "gpu.intel.com/memory.max",
    "gpu.intel.com/millicores",
    "gpu.intel.com/tiles",
    "gpu.intel.com/i915_monitoring",
    "gpu.intel.com/",
    "cpu",
]
ANNOTATION_KEYS = [
    model.ANNOTATION_ALLOW,
    model.ANNOTATION_DENY,
    model.ANNOTATION_SAME_GPU,
    model.ANNOTATION_XELINK,
    model.ANNOTATION_SINGLE_NUMA,
    model.ANNOTATION_CARDS,
    model.ANNOTATION_TILES,
]
LABEL_KEYS = [
    model.LABEL_GPU_NUMBERS,
    model.LABEL_GPU_NUMBERS + "2",
    model.LABEL_GPU_NUMBERS + "3",
    model.LABEL_CARDS,
    model.LABEL_PCI_GROUPS,
    model.LABEL_PCI_GROUPS + "2",
    model.LABEL_XE_LINKS,
    model.LABEL_XE_LINKS + "2",
    model.LABEL_NUMA_MAP,
    "telemetry.aware.scheduling.p/gas-disable-card0",
    "telemetry.aware.scheduling.p/gas-disable-card99",
    "telemetry.aware.scheduling.p/gas-disable-cardX",
    "telemetry.aware.scheduling.p/gas-deschedule-pods-card1",
    "telemetry.aware.scheduling.p/gas-prefer-gpu",
    "telemetry.aware.scheduling.p/gas-tile-disable-card0_gt1",
    "telemetry.aware.scheduling.p/gas-tile-deschedule-card1_gt0",
    "telemetry.aware.scheduling.p/gas-tile-deschedule-card1_gtX",
    "telemetry.aware.scheduling.p/gas-tile-preferred-card0",
    "telemetry.aware.scheduling.p/gas-tile-preferred-card0_gt3",
    "telemetry.aware.scheduling.p/x/gas-disable-card0",
    "telemetry.aware.scheduling.",
]

# Values built from the parsers' own alphabet, so the interesting branches are reached.
label_text = st.text(alphabet="0123456789.-_Zcardgt:+|,PCI_GROUP ", max_size=40) | st.sampled_from(
    [
        "0.1",
        "0.1.2.3",
        "card0.card1",
        "0.0-1.0_2.0-3.0",
        "0-0.1_1-2.3",
        "0.1_2.3",
        "PCI_GROUP",
        "card0",
        "gt1",
        "Z.2",
        "",
        "0." * 300,
        "9" * 400,
    ]
)
any_text = st.text(max_size=30)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
any_json = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=20,
)
quantity = st.sampled_from(ABSURD_QUANTITIES) | st.integers(0, 64).map(str) | any_json
resources = st.dictionaries(st.sampled_from(RESOURCES) | any_text, quantity, max_size=5)
container = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["a", "b", "c", "ü-名"]) | any_json,
        "resources": st.fixed_dictionaries(
            {}, optional={"limits": resources | any_json, "requests": resources | any_json}
        )
        | any_json,
    },
)
pod_annotations = st.dictionaries(
    st.sampled_from(ANNOTATION_KEYS) | any_text, label_text | any_json, max_size=4
)
labels = st.dictionaries(st.sampled_from(LABEL_KEYS) | any_text, label_text | any_json, max_size=8)
pod = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": any_text | any_json,
                "namespace": any_text,
                "uid": st.sampled_from(["u1", "u2"]) | any_json,
                "annotations": pod_annotations | any_json,
            },
        )
        | any_json,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(container | any_json, max_size=4) | any_json,
                "initContainers": st.lists(container | any_json, max_size=2) | any_json,
            },
        )
        | any_json,
    },
)
node = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"name": st.sampled_from(NODES) | any_text | any_json, "labels": labels}
        )
        | any_json,
        "status": st.fixed_dictionaries({}, optional={"allocatable": resources | any_json})
        | any_json,
    },
)
node_names = st.lists(st.sampled_from(NODES) | any_text, max_size=8) | any_json


def _args(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)


extender_args: st.SearchStrategy[Any] = (
    st.lists(
        st.tuples(st.sampled_from(["Pod", "pod", "POD"]), pod | any_json)
        | st.tuples(st.sampled_from(["NodeNames", "nodenames"]), node_names)
        | st.tuples(
            st.sampled_from(["Nodes", "nodes"]),
            st.fixed_dictionaries(
                {}, optional={"items": st.lists(node | any_json, max_size=5) | any_json}
            )
            | any_json,
        ),
        max_size=4,
    ).map(_args)
    | any_json
)
binding_args = (
    st.fixed_dictionaries(
        {},
        optional={
            "PodName": st.sampled_from(["placed", "nope"]) | any_text | any_json,
            "PodNamespace": st.sampled_from(["fuzz-ns", "default"]) | any_json,
            "PodUID": st.sampled_from(["u1", ""]) | any_json,
            "Node": st.sampled_from(NODES) | any_text | any_json,
            "podname": any_json,
        },
    )
    | any_json
)

FUZZ = settings(
    max_examples=int(os.environ.get("GAS_FUZZ_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


# ------------------------------------------------------------------ over HTTP


# The API-server double names objects with `random` in its own threads.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzzed_filter_and_bind_never_fail_the_server(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    before = ledger_of(server)
    bindings_before = cluster.count_requests("POST", "/binding$")

    @FUZZ
    @given(body=extender_args)
    def fuzz_filter(body: Any) -> None:
        COUNTS["http filter (hypothesis)"] += 1
        raw = json.dumps(body, allow_nan=True).encode()
        check_reply("/scheduler/filter", body, post_raw(server, "/scheduler/filter", raw))

    @FUZZ
    @given(body=binding_args)
    def fuzz_bind(body: Any) -> None:
        COUNTS["http bind (hypothesis)"] += 1
        raw = json.dumps(body, allow_nan=True).encode()
        # Pods of namespace fuzz-ns do not exist and `placed` is bound: no bind succeeds.
        check_reply("/scheduler/bind", body, post_raw(server, "/scheduler/bind", raw))

    fuzz_filter()
    fuzz_bind()
    assert server.session.get(server.url + "/healthz", timeout=5).status_code == 200
    after = ledger_of(server)
    assert after["usage"] == before["usage"], "filter reserved something"
    assert cluster.count_requests("POST", "/binding$") == bindings_before
    assert server.process.poll() is None
    assert "Traceback" not in server.log()


def _deep(depth: int) -> bytes:
    return b'{"Pod":' + b"[" * depth + b"]" * depth + b', "NodeNames": ["two-cards"]}'


def _names(count: int) -> list[str]:
    return [f"node-{i}-ü" for i in range(count)]


POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u-hand"}, "spec": {}}
POD["spec"] = gpu_pod("p")["spec"]

HAND_CASES: list[tuple[str, bytes]] = [
    ("not utf-8", b'{"Pod": {"metadata": {"name": "\xff\xfe"}}, "NodeNames": []}'),
    ("latin-1 body", '{"Pod": {}, "NodeNames": ["é"]}'.encode("latin-1")),
    ("utf-16 body", json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode("utf-16")),
    ("empty", b""),
    ("whitespace", b"   \n"),
    ("null", b"null"),
    ("array", b"[]"),
    ("number", b"1e400"),
    ("NaN literal", b'{"Pod": NaN, "NodeNames": []}'),
    (
        "Infinity quantity",
        b'{"Pod": {"spec": {"containers": [{"resources": {"limits": '
        b'{"gpu.intel.com/i915": Infinity}}}]}}, "NodeNames": ["two-cards"]}',
    ),
    (
        "1e400 quantity",
        b'{"Pod": {"spec": {"containers": [{"resources": {"limits": '
        b'{"gpu.intel.com/i915": 1e400}}}]}}, "NodeNames": ["two-cards"]}',
    ),
    (
        "huge integer",
        b'{"Pod": {"spec": {"containers": [{"resources": {"limits": '
        b'{"gpu.intel.com/i915": ' + b"9" * 5000 + b'}}}]}}, "NodeNames": []}',
    ),
    (
        "1e400 in a node object",
        json.dumps({"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "two-cards", "x": 1}}]}})
        .replace('"x": 1', '"x": 1e400')
        .encode(),
    ),
    (
        "-1e400 in the pod",
        json.dumps({"Pod": {**POD, "x": 1}, "NodeNames": ["two-cards"]})
        .replace('"x": 1', '"x": -1e400')
        .encode(),
    ),
    ("deep nesting", _deep(100_000)),
    ("nesting at the recursion limit", _deep(990)),
    ("nesting just under it", _deep(900)),
    ("duplicate keys", b'{"Pod": 1, "Pod": {"spec": {}}, "NodeNames": ["a"], "NodeNames": 7}'),
    (
        "duplicate case keys",
        json.dumps({"pod": 1, "Pod": POD, "NODENAMES": 3, "NodeNames": ["two-cards"]}).encode(),
    ),
    ("10,000 node names", json.dumps({"Pod": POD, "NodeNames": _names(10_000)}).encode()),
    (
        "10,000 duplicate names",
        json.dumps({"Pod": POD, "NodeNames": ["two-cards"] * 10_000}).encode(),
    ),
    ("huge flat array", json.dumps({"Pod": POD, "NodeNames": [0] * 60_000}).encode()),
    (
        "unicode names",
        json.dumps(
            {
                "Pod": {**POD, "metadata": {"name": "名前\u202e\x00", "uid": "\ud800"}},
                "NodeNames": ["\x00", "‮", "名"],
            }
        ).encode(),
    ),
    (
        "lone surrogate escape",
        b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": ["\\udfff"]}',
    ),
    ("nul bytes", b'{"Pod": {}, "NodeNames": ["a\\u0000b"]}\x00'),
    ("trailing garbage", b'{"Pod": {}, "NodeNames": []} xx'),
    ("bare key", b"{Pod: 1}"),
    (
        "nodes without names",
        json.dumps({"Pod": POD, "Nodes": {"items": [{"metadata": {}}]}}).encode(),
    ),
    (
        "both NodeNames and Nodes",
        json.dumps(
            {
                "Pod": POD,
                "NodeNames": ["two-cards"],
                "Nodes": {"items": [{"metadata": {"name": "x"}}]},
            }
        ).encode(),
    ),
    (
        "absurd memory",
        json.dumps(
            {
                "Pod": {
                    **POD,
                    "spec": {
                        "containers": [
                            {
                                "resources": {
                                    "limits": {
                                        "gpu.intel.com/i915": "1",
                                        "gpu.intel.com/memory.max": "1e400",
                                    }
                                }
                            }
                        ]
                    },
                },
                "NodeNames": NODES,
            }
        ).encode(),
    ),
    (
        "negative gpus",
        json.dumps(
            {
                "Pod": {
                    **POD,
                    "spec": {
                        "containers": [{"resources": {"limits": {"gpu.intel.com/i915": "-1"}}}]
                    },
                },
                "NodeNames": NODES,
            }
        ).encode(),
    ),
    ("bind with numbers", b'{"PodName": 1, "PodNamespace": 2, "PodUID": 3, "Node": 4}'),
    (
        "bind with huge strings",
        json.dumps(
            {"PodName": "p" * 100_000, "PodNamespace": "d", "PodUID": "u", "Node": "n"}
        ).encode(),
    ),
]


@pytest.mark.parametrize("route", ["/scheduler/filter", "/scheduler/bind"])
def test_hand_written_hostile_bodies(server: GasProcess, route: str) -> None:
    before = ledger_of(server)["usage"]
    for name, raw in HAND_CASES:
        COUNTS[f"http {route.rsplit('/', 1)[1]} (hand-written)"] += 1
        response = post_raw(server, route, raw)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = None
        try:
            check_reply(route, body, response)
        except AssertionError as exc:
            raise AssertionError(f"case {name!r}: {exc}") from exc
    assert ledger_of(server)["usage"] == before
    assert server.session.get(server.url + "/healthz", timeout=5).status_code == 200


def test_non_finite_numbers_are_refused_not_echoed(server: GasProcess) -> None:
    """A number JSON cannot carry back (1e400 parses to infinity) is a 400, not a reply
    body that says `Infinity` (invalid JSON for kube-scheduler)."""
    raw = json.dumps(
        {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "two-cards"}, "x": 1}]}}
    ).replace('"x": 1', '"x": 1e400')
    response = post_raw(server, "/scheduler/filter", raw.encode())
    assert response.status_code == 400
    assert "number" in response.json()["Error"]


# ------------------------------------------------------------------ raw transport


def tls_socket(server: GasProcess, tls: TLSFiles) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=tls.ca)
    context.load_cert_chain(tls.client_cert, tls.client_key)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=15)
    return context.wrap_socket(raw, server_hostname="localhost")


def read_reply(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ssl.SSLError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if length and len(body) >= length[0]:
                break
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data.partition(b"\r\n\r\n")[2]


def test_chunked_body_over_the_limit_is_refused(server: GasProcess, tls_files: TLSFiles) -> None:
    chunk = b"x" * 65536
    with tls_socket(server, tls_files) as sock:
        sock.sendall(
            b"POST /scheduler/filter HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sent = 0
        try:
            while sent <= MAX_BODY * 4:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # gas answered and closed before the whole body was sent: fine
        status, body = read_reply(sock)
    COUNTS["raw transport"] += 1
    assert status == 413, body[:200]
    assert "413" in json.loads(body)["Error"]


def test_small_chunked_body_is_served(server: GasProcess, tls_files: TLSFiles) -> None:
    payload = json.dumps({"Pod": POD, "NodeNames": NODES}).encode()
    with tls_socket(server, tls_files) as sock:
        sock.sendall(
            b"POST /scheduler/filter HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for start in range(0, len(payload), 100):
            piece = payload[start : start + 100]
            sock.sendall(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        status, body = read_reply(sock)
    COUNTS["raw transport"] += 1
    assert status == 200
    assert set(json.loads(body)) == REPLY_KEYS


def test_slow_clients_cannot_hold_the_threads(server: GasProcess, tls_files: TLSFiles) -> None:
    """THREADS+2 clients sending headers a byte at a time and THREADS+2 sending a small
    declared body a byte at a time; a normal request is still answered at once."""
    stop = threading.Event()
    opened: list[ssl.SSLSocket] = []

    def slow(head: bytes, body: bytes) -> None:
        try:
            sock = tls_socket(server, tls_files)
            opened.append(sock)
            sock.sendall(head)
            for byte in body:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            return

    header_drip = (
        b"",
        b"POST /scheduler/filter HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 99,
    )
    body_drip = (
        b"POST /scheduler/filter HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        b" " * 1000,
    )
    workers = [
        threading.Thread(target=slow, args=drip, daemon=True)
        for drip in [header_drip] * (THREADS + 2) + [body_drip] * (THREADS + 2)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.5)  # every slow client is connected and dripping
        for _ in range(3):
            started = time.monotonic()
            response = server.post("/scheduler/filter", {"Pod": POD, "NodeNames": NODES})
            assert response.status_code == 200
            assert time.monotonic() - started < 2.0
            COUNTS["raw transport"] += 1
    finally:
        stop.set()
        for sock in opened:
            sock.close()
        for worker in workers:
            worker.join(timeout=5)


# ------------------------------------------------------------------ in-process parsers

PARSE = settings(
    max_examples=int(os.environ.get("GAS_FUZZ_EXAMPLES_INPROC", "600")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


@PARSE
@given(value=quantity)
def test_parse_quantity_is_exact_or_refuses(value: Any) -> None:
    COUNTS["parse_quantity"] += 1
    try:
        result = parse_quantity(value)
    except QuantityError:
        return
    assert isinstance(result, int) and 0 <= result <= MAX_QUANTITY


@PARSE
@given(
    text=st.from_regex(
        r"\A[+-]?[0-9]{0,30}(\.[0-9]{0,12})?([eE][+-]?[0-9]{1,6}|[KMGTPE]i|[numkMGTPE])?\Z"
    )
)
def test_parse_quantity_on_quantity_shaped_text(text: str) -> None:
    COUNTS["parse_quantity (shaped)"] += 1
    try:
        result = parse_quantity(text)
    except QuantityError:
        return
    assert 0 <= result <= MAX_QUANTITY


@PARSE
@given(obj=node | any_json)
def test_node_from_object_never_raises(obj: Any) -> None:
    COUNTS["node_from_object (labels, allocatable, policy, xe-links, numa, pci)"] += 1
    if not isinstance(obj, dict):
        obj = {"metadata": obj}
    gpu = model.node_from_object(obj)
    assert isinstance(gpu, model.NodeGpu)
    if gpu.problem is None:
        assert len(gpu.cards) >= 1 and len(set(gpu.cards)) == len(gpu.cards)
        assert all(v >= 0 for v in gpu.capacity.values())
        for (card_a, _), (card_b, _) in gpu.xe_links:
            assert card_a in gpu.cards and card_b in gpu.cards
        for group in gpu.numa_groups:
            assert set(group) <= set(gpu.cards)


@PARSE
@given(value=label_text | any_text, key=st.sampled_from(LABEL_KEYS))
def test_label_parsers_refuse_cleanly(value: str, key: str) -> None:
    COUNTS["label parsers (cards, split, tile, xe-link, numa, pci)"] += 1
    cards = ("card0", "card1", "card2", "card3")
    for parse in (
        lambda: model.node_cards({model.LABEL_GPU_NUMBERS: value}),
        lambda: model.node_cards({model.LABEL_CARDS: value}),
        lambda: model.read_split_label({key: "0", key + "2": value}, key),
        lambda: model._xe_links(value, cards),
        lambda: model._numa_groups(value, cards),
        lambda: model._number_groups(value, key),
        lambda: model._tile_label(key, value),
        lambda: model._label_card(key, value),
    ):
        try:
            parse()
        except model.SpecError as exc:
            assert str(exc)


@PARSE
@given(obj=pod | any_json)
def test_pod_request_refuses_with_spec_error_only(obj: Any) -> None:
    COUNTS["pod_request (resources, allow/deny/same-gpu/xelink/numa annotations)"] += 1
    if not isinstance(obj, dict):
        obj = {"spec": obj}
    try:
        ask = model.pod_request(obj)
    except model.SpecError as exc:
        assert str(exc)
        return
    assert all(c.gpus >= 0 for c in ask.containers)
    assert all(v >= 0 for c in ask.containers for v in c.requests.values())
    assert all(isinstance(p, str) and p for p in ask.problems.values())


@PARSE
@given(
    value=st.text(alphabet="card0123,|:+gtx ", max_size=40) | any_text,
    containers=st.integers(0, 4),
)
def test_allocation_annotation_parsers(value: str, containers: int) -> None:
    COUNTS["parse_cards / parse_tiles"] += 1
    try:
        allocation = model.parse_cards(value, containers)
    except model.SpecError:
        allocation = (("card0",), ("card1", "card2"), (), ("card3",))[:containers]
    else:
        assert model.format_cards(allocation) == value
    try:
        tiles = model.parse_tiles(value, allocation)
    except model.SpecError:
        return
    assert model.parse_tiles(model.format_tiles(tiles), allocation) == tiles


# ------------------------------------------------------------------ atheris (optional)

ATHERIS_HARNESS = r"""
import json, sys
import atheris
with atheris.instrument_imports():
    from gas.core import model
    from gas.core.quantity import QuantityError, parse_quantity

COUNT = 0

def one(data: bytes) -> None:
    global COUNT
    COUNT += 1
    fdp = atheris.FuzzedDataProvider(data)
    text = fdp.ConsumeUnicodeNoSurrogates(64)
    try:
        parse_quantity(text)
    except QuantityError:
        pass
    labels = {model.LABEL_GPU_NUMBERS: fdp.ConsumeUnicodeNoSurrogates(24),
              model.LABEL_XE_LINKS: fdp.ConsumeUnicodeNoSurrogates(24),
              model.LABEL_NUMA_MAP: fdp.ConsumeUnicodeNoSurrogates(24),
              model.LABEL_PCI_GROUPS: fdp.ConsumeUnicodeNoSurrogates(24),
              "telemetry.aware.scheduling.p/gas-" + fdp.ConsumeUnicodeNoSurrogates(24):
                  fdp.ConsumeUnicodeNoSurrogates(12)}
    model.node_from_object({"metadata": {"name": "n", "labels": labels},
                            "status": {"allocatable": {"gpu.intel.com/i915": text}}})
    try:
        body = json.loads(fdp.ConsumeUnicodeNoSurrogates(400))
    except (ValueError, RecursionError):
        return
    if isinstance(body, dict):
        try:
            model.pod_request(body)
        except model.SpecError:
            pass
        model.node_from_object(body)

atheris.Setup(sys.argv, one)
atheris.Fuzz()
"""


def test_atheris_coverage_guided_parsers(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    harness = tmp_path / "harness.py"
    harness.write_text(ATHERIS_HARNESS)
    runs = os.environ.get("GAS_ATHERIS_RUNS", "20000")
    result = subprocess.run(
        [sys.executable, str(harness), f"-runs={runs}", "-max_len=600", "-rss_limit_mb=2048"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    done = [line for line in output.splitlines() if line.startswith("Done ")]
    assert done, output[-2000:]
    COUNTS["atheris (quantity, node labels, pod_request)"] += int(done[-1].split()[1])
