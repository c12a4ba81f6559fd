"""`gas webhook` as a process: real gunicorn, real TLS, AdmissionReviews as the API server
sends them, the JSON patch applied to the pod and the result checked."""

from __future__ import annotations

import copy
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from gas.serving.webhook_app import ADMISSION_PODS
from tests.support.admission import I915, MEM, container, gpu_pod, patched, review_request
from tests.support.gasproc import TLSFiles
from tests.support.promtext import metric
from tests.support.webhookproc import WebhookProcess
from tests.unit.test_admission import CASES

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def start_webhook(tmp_path: Path, tls_files: TLSFiles) -> Iterator[Callable[..., WebhookProcess]]:
    started: list[WebhookProcess] = []

    def start(args: Sequence[str] = (), tls: TLSFiles | None = None) -> WebhookProcess:
        process = WebhookProcess(
            list(args), tmp_path / f"webhook-{len(started)}.log", tls or tls_files
        )
        started.append(process)
        process.wait_status("/readyz", 200)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def webhook(start_webhook: Callable[..., WebhookProcess]) -> WebhookProcess:
    return start_webhook()


def admit(webhook: WebhookProcess, review: dict[str, Any]) -> dict[str, Any]:
    response = webhook.post(ADMISSION_PODS, review)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    answer: dict[str, Any] = response.json()
    assert answer["response"]["uid"] == review["request"]["uid"]
    return answer


def test_a_gpu_pod_is_sent_to_gas_scheduler(webhook: WebhookProcess) -> None:
    pod = gpu_pod("trainer")
    answer = admit(webhook, review_request(pod))
    after = patched(pod, answer)
    assert after["spec"]["schedulerName"] == "gas-scheduler"
    expected = copy.deepcopy(pod)
    expected["spec"]["schedulerName"] = "gas-scheduler"
    assert after == expected
    # Created without a schedulerName (no defaulting seen yet): the member is added.
    bare = gpu_pod("bare", scheduler=None)
    assert patched(bare, admit(webhook, review_request(bare)))["spec"]["schedulerName"] == (
        "gas-scheduler"
    )


def test_a_malformed_gpu_pod_is_refused_with_the_reason_and_logged(
    webhook: WebhookProcess,
) -> None:
    pod = gpu_pod("broken", limits={I915: "1", MEM: "1.5"})
    answer = admit(webhook, review_request(pod))
    response = answer["response"]
    assert response["allowed"] is False
    reason = "gpu: container 'app' gpu.intel.com/memory.max: quantity '1.5' is not a whole number"
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == reason
    webhook_log = webhook.log()
    assert f"refused pod default/broken: {reason}" in webhook_log


def test_init_container_gpus_refused(webhook: WebhookProcess) -> None:
    pod = gpu_pod("init", init=[container("setup", {I915: "1"})])
    response = admit(webhook, review_request(pod))["response"]
    assert response["allowed"] is False
    assert "init container 'setup' requests GPU resources" in response["status"]["message"]


def test_pods_without_gpu_and_other_schedulers_are_untouched(webhook: WebhookProcess) -> None:
    for pod in (
        gpu_pod("plain", limits={"cpu": "1"}),
        gpu_pod("mine", scheduler="my-scheduler"),
        gpu_pod("kept", annotations={"gas-keep-scheduler": "true"}),
    ):
        answer = admit(webhook, review_request(pod))
        assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}
        assert patched(pod, answer) == pod


def test_update_of_an_existing_pod_is_allowed_unchanged(webhook: WebhookProcess) -> None:
    # Even a pod that would be refused at creation (made before the webhook existed).
    old = gpu_pod("old", limits={I915: "1", MEM: "1.5"})
    old["spec"]["nodeName"] = "node-1"
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "vision"}
    answer = admit(webhook, review_request(new, "UPDATE", old=old))
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}


def test_dry_run_gets_the_same_answer(webhook: WebhookProcess) -> None:
    for case in CASES:
        if case.policy.allowlist or case.policy.denylist:
            continue
        real = admit(webhook, review_request(case.pod, uid="u-1"))
        dry = admit(webhook, review_request(case.pod, uid="u-1", dry_run=True))
        assert dry == real, case.id
    assert "(dry run)" in webhook.log()


def test_allowlist_flag_decides_whether_gas_allow_counts(
    start_webhook: Callable[..., WebhookProcess],
) -> None:
    pod = gpu_pod("allow", annotations={"gas-allow": "gpu0"})
    off = start_webhook()
    assert admit(off, review_request(pod))["response"]["allowed"] is True
    on = start_webhook(["--enableAllowlist"])
    response = admit(on, review_request(pod))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "gpu: pod annotation gas-allow is malformed: 'gpu0' is not a card name like card0"
    )


def test_validate_only_and_scheduler_name_flags(
    start_webhook: Callable[..., WebhookProcess],
) -> None:
    validating = start_webhook(["--validateOnly=true"])
    pod = gpu_pod("v")
    answer = admit(validating, review_request(pod))
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}
    bad = gpu_pod("bad", limits={I915: "-1"})
    assert admit(validating, review_request(bad))["response"]["allowed"] is False
    named = start_webhook(["--schedulerName", "gpu-scheduler"])
    assert patched(pod, admit(named, review_request(pod)))["spec"]["schedulerName"] == (
        "gpu-scheduler"
    )


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}'],
)
def test_a_malformed_review_gets_400_with_a_json_body(webhook: WebhookProcess, body: bytes) -> None:
    response = webhook.session.post(
        webhook.url + ADMISSION_PODS,
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["Error"].startswith("bad request: ")
    assert "bad request to /admission/pods" in webhook.log()


def test_routes_statuses_and_metrics(webhook: WebhookProcess) -> None:
    assert webhook.get_json("/healthz") == {"status": "ok"}
    assert webhook.get_json("/readyz") == {"status": "ok"}
    assert webhook.session.get(webhook.url + ADMISSION_PODS, timeout=5).status_code == 405
    assert webhook.session.get(webhook.url + "/scheduler/filter", timeout=5).status_code == 404
    admit(webhook, review_request(gpu_pod("m")))
    admit(webhook, review_request(gpu_pod("n", limits={"cpu": "1"})))
    admit(webhook, review_request(gpu_pod("r", limits={I915: "0.5"})))
    admit(webhook, review_request(gpu_pod("r2", limits={I915: "99"})))
    webhook.post(ADMISSION_PODS, ["not a review"])
    text = webhook.session.get(webhook.url + "/metrics", timeout=5).text
    reviews = "gas_admission_reviews_total"
    assert metric(text, reviews, outcome="mutated") == 1
    assert metric(text, reviews, outcome="allowed") == 1
    assert metric(text, reviews, outcome="refused") == 2
    # The 400 and the 405 on the webhook's route; not the 404 elsewhere.
    assert metric(text, reviews, outcome="error") == 2


def test_no_client_certificate_is_asked_for(webhook: WebhookProcess, tls_files: TLSFiles) -> None:
    """The API server presents none: the handshake completes without one, and the server
    is verified by the CA under its name."""
    context = ssl.create_default_context(cafile=tls_files.ca)
    with (
        socket.create_connection(("127.0.0.1", webhook.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 200")
    # Plain HTTP gets no answer.
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{webhook.port}/healthz", timeout=5)


def test_bad_start_says_why(tmp_path: Path, tls_files: TLSFiles) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gas.cli", "webhook", "--host", "127.0.0.1", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    missing = run("--cert", str(tmp_path / "none.crt"), "--key", tls_files.server_key)
    assert missing.returncode == 1
    assert "none.crt" in missing.stderr and "Traceback" not in missing.stderr
    swapped = run("--cert", tls_files.server_cert, "--key", tls_files.client_key)
    assert swapped.returncode == 1 and "does not match" in swapped.stderr
    empty = run("--cert", tls_files.server_cert, "--key", tls_files.server_key, "--schedulerName=")
    assert empty.returncode == 2 and "--schedulerName" in empty.stderr
    no_cert = run("--key", tls_files.server_key)
    assert no_cert.returncode == 2 and "--cert" in no_cert.stderr
