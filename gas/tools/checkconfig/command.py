"""`gas check-config`: `check` over the documents of the files given, and the command line."""

from __future__ import annotations

import argparse
import sys

from gas.tools.checkconfig.checker import Checker, ConfigReport
from gas.tools.checkconfig.configuration import check_scheduler_configuration
from gas.tools.checkconfig.load import (
    LocatedMap,
    ParseError,
    Source,
    line_of,
    parse_documents,
    text_offset,
)
from gas.tools.checkconfig.policy import (
    POLICY_CONFIGMAP,
    RBAC_KINDS,
    SCHEDULER_USER,
    can_get_configmap,
    check_policy,
    check_policy_configmap,
    policy_text,
)
from gas.tools.checkconfig.values import CONFIG_GROUP, FORMS, Version, parse_version
from gas.tools.checkconfig.workload import Workload, find_workload


def check(sources: list[Source], version: Version | None) -> ConfigReport:
    """The findings of every document of ``sources``; with ``version``, also whether that
    Kubernetes version loads each format."""
    report = ConfigReport()
    several_files = len(sources) > 1
    rbac = [
        doc
        for source in sources
        for doc in source.documents
        if isinstance(doc, LocatedMap) and doc.get("kind") in RBAC_KINDS
    ]
    # The Deployment that runs the scheduler, when given: its flags are held against the
    # configuration.
    workload = find_workload(
        [doc for source in sources for doc in source.documents if isinstance(doc, LocatedMap)]
    )
    found = False
    for source in sources:
        documents = [d for d in source.documents if d is not None]
        for number, doc in enumerate(documents, start=1):
            prefix = f"{source.label}:" if several_files else ""
            if len(documents) > 1:
                prefix += f"doc{number}:"
            checker = Checker(report, version, prefix)
            if not isinstance(doc, LocatedMap):
                continue
            start = len(report.findings)
            kind = doc.get("kind")
            if kind == "KubeSchedulerConfiguration":
                found = True
                _configuration(checker, doc, workload)
            elif kind == "Policy":
                found = True
                check_policy(checker, doc)
            elif kind == "ConfigMap":
                text, offset, problem = policy_text(doc)
                wrapped = configuration_text(doc)
                if problem is not None:
                    found = True
                    checker.error("data", problem, line_of(doc, "data"))
                elif text is not None:
                    found = True
                    checker.duplicates(doc, policy=True)
                    check_policy_configmap(checker, doc, text, offset, rbac or None)
                elif wrapped is not None:
                    found = True
                    _wrapped_configuration(checker, doc, wrapped, workload)
            elif kind is None and "extenders" in doc:
                found = True
                checker.error(
                    "kind",
                    "missing: a scheduler configuration needs kind: "
                    "KubeSchedulerConfiguration (or Policy)",
                    doc.line,
                )
            # Stable: findings without a line keep their place ahead of the located ones.
            report.findings[start:] = sorted(report.findings[start:], key=lambda f: f.line or 0)
    labels = ", ".join(source.label for source in sources)
    if not found and rbac:
        # RBAC alone: check it against the ConfigMap that configmap-getter.yaml is for.
        if not can_get_configmap(rbac, SCHEDULER_USER, "kube-system", POLICY_CONFIGMAP):
            report.error(
                labels,
                f"none of these RBAC objects lets user {SCHEDULER_USER} get ConfigMap "
                f"kube-system/{POLICY_CONFIGMAP} (give the Policy ConfigMap too to check "
                "against another name)",
            )
    elif not found:
        report.error(
            labels,
            "no KubeSchedulerConfiguration (raw or in a ConfigMap), Policy or Policy ConfigMap "
            "(key policy.cfg) found",
        )
    return report


def _configuration(checker: Checker, doc: LocatedMap, workload: Workload | None) -> None:
    api_version = doc.get("apiVersion")
    form = FORMS.get(str(api_version))
    if form is None:
        checker.error(
            "apiVersion",
            f"unknown apiVersion {api_version!r} for KubeSchedulerConfiguration: "
            "use kubescheduler.config.k8s.io/v1 (Kubernetes 1.25+) or v1beta3 "
            "(1.23-1.28)",
            line_of(doc, "apiVersion"),
        )
        form = FORMS[CONFIG_GROUP + "v1"]
    check_scheduler_configuration(checker, doc, form, workload)


def configuration_text(doc: LocatedMap) -> tuple[str, str, int] | None:
    """(key, text, line offset) of a KubeSchedulerConfiguration held in a ConfigMap's data
    (the any-cluster scheduler's configuration file), or None."""
    data = doc.get("data")
    if not isinstance(data, LocatedMap):
        return None
    for key, value in data.items():
        if isinstance(value, str) and "KubeSchedulerConfiguration" in value:
            return str(key), value, text_offset(data, key)
    return None


def _wrapped_configuration(
    checker: Checker, doc: LocatedMap, wrapped: tuple[str, str, int], workload: Workload | None
) -> None:
    key, text, offset = wrapped
    checker.duplicates(doc)
    where = f"data[{key}]"
    try:
        documents = [d for d in parse_documents(text, offset) if d is not None]
    except ParseError as exc:
        checker.error(where, str(exc), exc.line)
        return
    if len(documents) != 1 or not isinstance(documents[0], LocatedMap):
        checker.error(where, "must hold one KubeSchedulerConfiguration", line_of(doc, "data"))
        return
    inner = Checker(checker.report, checker.version, f"{checker.prefix}{where}.")
    config = documents[0]
    if config.get("kind") != "KubeSchedulerConfiguration":
        inner.error(
            "kind",
            f'must be "KubeSchedulerConfiguration", not {config.get("kind")!r}',
            line_of(config, "kind"),
        )
        return
    _configuration(inner, config, workload)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a kube-scheduler configuration that registers gas: KubeSchedulerConfiguration "
        "(v1, v1beta3; raw, or in a ConfigMap as deploy/any-cluster holds it), the legacy "
        "Policy JSON, or a Policy ConfigMap (key policy.cfg). A scheduler of gas's own (no "
        "default-scheduler profile) is checked against the Deployment that runs it, when "
        "given too: the webhook's --schedulerName, gas's --schedulerLease and --port. "
        "Prints one line per finding (ERROR or WARNING, the field, the problem), or OK; "
        "exits 1 if there is an ERROR. RBAC objects given alongside a Policy ConfigMap are "
        "checked for letting kube-scheduler read it."
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="configuration file(s)")
    parser.add_argument(
        "--kubernetesVersion",
        metavar="VERSION",
        help="the cluster's Kubernetes version (e.g. 1.28): also check that it loads this format",
    )


def run(args: argparse.Namespace) -> int:
    version: Version | None = None
    if args.kubernetesVersion:
        try:
            version = parse_version(args.kubernetesVersion)
        except ValueError as exc:
            print(f"gas check-config: --kubernetesVersion: {exc}", file=sys.stderr)
            return 2
    sources: list[Source] = []
    parse_report = ConfigReport()
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"gas check-config: cannot read {path}: {reason}", file=sys.stderr)
            return 2
        try:
            sources.append(Source(path, parse_documents(text)))
        except ParseError as exc:
            parse_report.error(path, str(exc), exc.line)
    report = parse_report if parse_report.findings else check(sources, version)
    for finding in report.findings:
        print(finding)
    if not report.findings:
        print("OK")
    return 1 if report.failed else 0
