"""`gas check-config`: `check` over the documents of the files given, and the command line."""

from __future__ import annotations

import argparse
import sys

from gas.tools.checkconfig.checker import Checker, ConfigReport
from gas.tools.checkconfig.configuration import check_scheduler_configuration
from gas.tools.checkconfig.load import LocatedMap, ParseError, Source, line_of, parse_documents
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
            api_version = doc.get("apiVersion")
            if kind == "KubeSchedulerConfiguration":
                found = True
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
                check_scheduler_configuration(checker, doc, form)
            elif kind == "Policy":
                found = True
                check_policy(checker, doc)
            elif kind == "ConfigMap":
                text, offset, problem = policy_text(doc)
                if problem is not None:
                    found = True
                    checker.error("data", problem, line_of(doc, "data"))
                elif text is not None:
                    found = True
                    checker.duplicates(doc, policy=True)
                    check_policy_configmap(checker, doc, text, offset, rbac or None)
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
            "no KubeSchedulerConfiguration, Policy or Policy ConfigMap (key policy.cfg) found",
        )
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a kube-scheduler configuration that registers gas: KubeSchedulerConfiguration "
        "(v1, v1beta3), the legacy Policy JSON, or a Policy ConfigMap (key policy.cfg). "
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
