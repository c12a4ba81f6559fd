"""The Event sender both gas processes use (gas/kubeapi/events.py): Events are posted in
order on its own thread, a failed post is logged and does not stop the next, a full queue
drops (and counts) rather than blocks, and the Event bodies of the extender and the node
agent."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from gas.kubeapi.events import QUEUE_SIZE, EventSender, event_body

POD = {"kind": "Pod", "name": "p", "namespace": "team-a", "uid": "u1"}


def test_events_are_posted_in_order_and_a_failure_does_not_stop_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    posted: list[tuple[str, str]] = []
    done = threading.Event()

    def post(namespace: str, event: dict[str, Any]) -> None:
        if event["reason"] == "Refused":
            raise RuntimeError("403 forbidden")
        posted.append((namespace, event["reason"]))
        if event["reason"] == "Last":
            done.set()

    stop = threading.Event()
    sender = EventSender(post, stop, failure_level=logging.INFO)
    for reason in ("First", "Refused", "Last"):
        sender.send(event_body(POD, "Normal", reason, "m", component="gas", instance="i"))
    with caplog.at_level(logging.INFO, logger="gas.kubeapi.events"):
        sender.start()
        assert done.wait(10)
        stop.set()
        sender.join(10)
    assert posted == [("team-a", "First"), ("team-a", "Last")]
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "Refused" in record.getMessage() and "403 forbidden" in record.getMessage()
    assert sender.dropped == 0


def test_a_full_queue_drops_events_rather_than_waiting() -> None:
    sender = EventSender(lambda namespace, event: None, threading.Event())
    event = event_body(POD, "Normal", "R", "m", component="gas", instance="i")
    for _ in range(QUEUE_SIZE + 3):
        sender.send(event)  # not started: nothing is taken off the queue
    assert sender.dropped == 3


def test_event_bodies_of_the_extender_and_the_node_agent() -> None:
    extender = event_body(POD, "Warning", "FailedBind", "x" * 2000, component="gas", instance="h")
    assert extender["metadata"] == {"generateName": "p.", "namespace": "team-a"}
    assert extender["involvedObject"] == {"apiVersion": "v1", **POD}
    assert extender["source"] == {"component": "gas"}
    assert (extender["reportingComponent"], extender["reportingInstance"]) == ("gas", "h")
    assert len(extender["message"]) == 1000
    assert extender["firstTimestamp"] == extender["lastTimestamp"]
    assert extender["count"] == 1

    node = {"kind": "Node", "name": "n1", "uid": "n1"}
    agent = event_body(node, "Warning", "R", "m", component="gas-node", instance="i", host="n1")
    # No namespace given: the Event goes to `default`, as the API server wants one.
    assert agent["metadata"]["namespace"] == "default"
    assert agent["source"] == {"component": "gas-node", "host": "n1"}
