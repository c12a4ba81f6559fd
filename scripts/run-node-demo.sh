#!/usr/bin/env bash
# The node half against the test doubles: an API-server double, two nodes each with fake
# sysfs, a kubelet double and a real `gas node`, the real `gas serve` and a kube-scheduler
# emulator; prints what each container received next to what gas chose. --keep: stay up.
source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/python -m tests.support.node_demo "$@"
