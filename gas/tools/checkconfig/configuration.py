"""KubeSchedulerConfiguration: its top-level fields and clientConnection."""

from __future__ import annotations

from gas.tools.checkconfig.checker import Checker
from gas.tools.checkconfig.extenders import check_extenders
from gas.tools.checkconfig.load import LocatedMap, join_path, line_of
from gas.tools.checkconfig.values import Form, type_name
from gas.tools.checkconfig.workload import (
    Workload,
    check_default_profile_url,
    check_second_scheduler,
    second_scheduler,
)

CLIENT_CONNECTION_FIELDS = ("kubeconfig", "acceptContentTypes", "contentType", "qps", "burst")
CONFIG_FIELDS = (
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
)


def check_scheduler_configuration(
    checker: Checker, doc: LocatedMap, form: Form, workload: Workload | None = None
) -> None:
    """The configuration's own fields and its extenders; a scheduler of gas's own (no
    default-scheduler profile) also by the rules of that form, held to ``workload``'s
    flags when the Deployment that runs it was given too."""
    checker.duplicates(doc)
    checker.versions(form, "apiVersion", line_of(doc, "apiVersion"))
    if "kubeconfig" in doc:
        checker.error(
            "kubeconfig",
            'unknown field "kubeconfig": it belongs under clientConnection.kubeconfig '
            "(strict decoding error; kube-scheduler does not start)",
            line_of(doc, "kubeconfig"),
        )
    checker.unknown_fields(
        doc,
        "",
        CONFIG_FIELDS + form.extra_fields,
        "a KubeSchedulerConfiguration",
        form,
        strict=False,
        ignore=("kubeconfig",),
    )
    second = second_scheduler(doc)
    _client_connection(checker, doc, form, in_cluster=second)
    profiles = doc.get("profiles")
    if isinstance(profiles, list):
        for index, profile in enumerate(profiles):
            if isinstance(profile, LocatedMap) and "extenders" in profile:
                checker.error(
                    join_path(join_path("profiles", index), "extenders"),
                    "extenders is a top-level field shared by all profiles, not a "
                    "profile field (strict decoding error; kube-scheduler does not start)",
                    line_of(profile, "extenders"),
                )
    check_extenders(checker, doc, form, workload.policy if workload else None)
    if second:
        check_second_scheduler(checker, doc, workload)
    else:
        check_default_profile_url(checker, doc)


def _client_connection(checker: Checker, doc: LocatedMap, form: Form, in_cluster: bool) -> None:
    """``in_cluster``: a scheduler run as a workload, where no kubeconfig means the pod's
    ServiceAccount (the in-cluster configuration), as it should."""
    connection = doc.get("clientConnection")
    consequence = (
        "with --config, kube-scheduler ignores its --kubeconfig flag and falls back to "
        "the in-cluster configuration, which a kubeadm static pod does not have; set "
        "clientConnection.kubeconfig (e.g. /etc/kubernetes/scheduler.conf)"
    )
    if connection is None:
        if not in_cluster:
            checker.warning("clientConnection", f"missing: {consequence}", doc.line)
        return
    if not isinstance(connection, LocatedMap):
        checker.error(
            "clientConnection",
            f"must be a mapping, not {type_name(connection)}",
            line_of(doc, "clientConnection"),
        )
        return
    checker.unknown_fields(
        connection,
        "clientConnection",
        CLIENT_CONNECTION_FIELDS,
        "clientConnection",
        form,
    )
    kubeconfig = connection.get("kubeconfig")
    if kubeconfig is not None and not isinstance(kubeconfig, str):
        checker.expect_type(connection, "kubeconfig", "clientConnection", str, "a string")
    elif not kubeconfig and not in_cluster:
        checker.warning(
            "clientConnection.kubeconfig",
            f"empty: {consequence}",
            line_of(connection, "kubeconfig"),
        )
