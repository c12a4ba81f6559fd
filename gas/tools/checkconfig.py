"""`gas check-config`: lint a kube-scheduler configuration that registers gas.

kube-scheduler reports most extender mistakes late or never: a misspelt field stops it at
startup with a terse strict-decoding error, and a wrong TLS or timeout setting shows up only
as failed or silently unchecked calls. This checker knows the rules of the protocol
reference (sections 1.5, 4, 5, 6 and 8) and names each problem with its place in the file.

Accepted inputs: KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, v1beta3, and the
older betas), the legacy Policy JSON (Kubernetes <= 1.22), and a Policy wrapped in a
ConfigMap under the key ``policy.cfg``. RBAC objects given alongside a Policy ConfigMap are
checked for letting kube-scheduler read it.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import difflib
import ipaddress
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

GAS_ROUTES = {"filterVerb": "/scheduler/filter", "bindVerb": "/scheduler/bind"}
PRIORITIZE_ROUTE = "/scheduler/prioritize"
PREEMPT_ROUTE = "/scheduler/preempt"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
GPU_PREFIX = "gpu.intel.com/"
POLICY_KEY = "policy.cfg"
POLICY_CONFIGMAP = "scheduler-extender-policy"
SCHEDULER_USER = "system:kube-scheduler"
CONFIG_GROUP = "kubescheduler.config.k8s.io/"

Version = tuple[int, int]

EXTENDER_FIELDS = (
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "bindVerb",
    "weight",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
)
TLS_FIELDS = (
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
)
MANAGED_RESOURCE_FIELDS = ("name", "ignoredByScheduler")
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
POLICY_FIELDS = (
    "kind",
    "apiVersion",
    "predicates",
    "priorities",
    "extenders",
    "hardPodAffinitySymmetricWeight",
    "alwaysCheckAllPredicates",
)
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


@dataclass(frozen=True)
class Form:
    """One configuration format and the Kubernetes versions that load it."""

    name: str
    policy: bool
    https_field: str
    since: Version | None = None
    deprecated: Version | None = None
    removed: Version | None = None
    extra_fields: tuple[str, ...] = ()


FORMS = {
    CONFIG_GROUP + "v1": Form(
        "kubescheduler.config.k8s.io/v1",
        False,
        "enableHTTPS",
        since=(1, 25),
        extra_fields=("delayCacheUntilActive",),
    ),
    CONFIG_GROUP + "v1beta3": Form(
        "kubescheduler.config.k8s.io/v1beta3",
        False,
        "enableHTTPS",
        since=(1, 23),
        deprecated=(1, 26),
        removed=(1, 29),
    ),
    CONFIG_GROUP + "v1beta2": Form(
        "kubescheduler.config.k8s.io/v1beta2",
        False,
        "enableHTTPS",
        since=(1, 22),
        deprecated=(1, 25),
        removed=(1, 28),
        extra_fields=("healthzBindAddress", "metricsBindAddress"),
    ),
    CONFIG_GROUP + "v1beta1": Form(
        "kubescheduler.config.k8s.io/v1beta1",
        False,
        "enableHTTPS",
        since=(1, 19),
        removed=(1, 23),
        extra_fields=("healthzBindAddress", "metricsBindAddress"),
    ),
}
POLICY = Form("the legacy Policy API", True, "enableHttps", removed=(1, 23))

# Go's time.ParseDuration, which metav1.Duration uses.
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_SECOND = 1_000_000_000
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


# --------------------------------------------------------------------------------------
# Findings
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    severity: str  # "ERROR" or "WARNING"
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.severity} {self.path}: {self.message}{where}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    def error(self, path: str, message: str, line: int | None = None) -> None:
        self.findings.append(Finding("ERROR", path, message, line))

    def warning(self, path: str, message: str, line: int | None = None) -> None:
        self.findings.append(Finding("WARNING", path, message, line))

    @property
    def failed(self) -> bool:
        return any(f.severity == "ERROR" for f in self.findings)


# --------------------------------------------------------------------------------------
# Loading with line numbers and duplicate keys
# --------------------------------------------------------------------------------------


class _Map(dict[Any, Any]):
    """A mapping that remembers where it and its keys are, and keys given twice."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}
        self.value_lines: dict[Any, tuple[int, str | None]] = {}
        self.duplicates: list[tuple[Any, int | None]] = []


class _Seq(list[Any]):
    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line


def _loader_class() -> type[Any]:
    import yaml

    class Loader(yaml.SafeLoader):
        line_offset = 0

        def line_of(self, node: yaml.Node) -> int:
            return int(node.start_mark.line) + 1 + self.line_offset

    def construct_map(loader: Loader, node: yaml.MappingNode) -> Iterator[_Map]:
        result = _Map(loader.line_of(node))
        yield result
        loader.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                key = str(key)
            if key in result:
                result.duplicates.append((key, loader.line_of(key_node)))
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_lines[key] = loader.line_of(key_node)
            style = value_node.style if isinstance(value_node, yaml.ScalarNode) else None
            result.value_lines[key] = (loader.line_of(value_node), style)

    def construct_seq(loader: Loader, node: yaml.SequenceNode) -> Iterator[_Seq]:
        result = _Seq(loader.line_of(node))
        yield result
        result.extend(loader.construct_object(child, deep=True) for child in node.value)

    Loader.add_constructor("tag:yaml.org,2002:map", construct_map)
    Loader.add_constructor("tag:yaml.org,2002:seq", construct_seq)
    return Loader


class ParseError(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def parse_documents(text: str, line_offset: int = 0) -> list[Any]:
    """All documents of a YAML (or JSON) text, mappings as ``_Map`` with line numbers."""
    import yaml

    loader = _loader_class()(text)
    loader.line_offset = line_offset
    try:
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
        return documents
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 + line_offset if mark is not None else None
        problem = exc.problem or exc.context or "cannot parse"
        # JSON that YAML cannot read (tabs, for one) is still valid Policy JSON.
        try:
            return [_from_json(text)]
        except ValueError:
            raise ParseError(f"not valid YAML or JSON: {problem}", line) from None
    except yaml.YAMLError as exc:
        raise ParseError(f"not valid YAML or JSON: {exc}", None) from None
    finally:
        loader.dispose()


def _from_json(text: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> _Map:
        result = _Map()
        for key, value in items:
            if key in result:
                result.duplicates.append((key, None))
            result[key] = value
        return result

    return json.loads(text, object_pairs_hook=pairs)


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def _line(obj: Any, key: Any = None) -> int | None:
    if isinstance(obj, _Map):
        if key is not None and key in obj.key_lines:
            return obj.key_lines[key]
        return obj.line
    if isinstance(obj, _Seq):
        return obj.line
    return None


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_go_duration(text: str) -> int | None:
    """Nanoseconds of a Go duration string (``10s``, ``1m30s``, ``-5s``), else None."""
    body = text.strip()
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        return None
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(body):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(body):
        return None
    return sign * int(total)


def _format_ns(ns: int) -> str:
    if ns % _SECOND == 0:
        return f"{ns // _SECOND}s"
    return f"{ns / _SECOND:g}s"


def parse_version(text: str) -> Version:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?", text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes version: {text!r} (expected e.g. 1.28 or v1.28.3)")
    return int(match.group(1)), int(match.group(2))


def _v(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def extended_resource_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None if it is."""
    if "/" not in name:
        return "an extended resource name needs a domain prefix (like gpu.intel.com/i915)"
    if "kubernetes.io/" in name:
        return "names in the kubernetes.io domain are native resources, not extended ones"
    if name.startswith("requests."):
        return "an extended resource name must not start with 'requests.'"
    prefix, _, rest = name.partition("/")
    if "/" in rest:
        return "a resource name has one '/'"
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        return f"{prefix!r} is not a valid DNS subdomain (lowercase letters, digits, - and .)"
    if not rest or len(rest) > 63 or not _QUALIFIED_NAME.match(rest):
        return f"{rest!r} is not a valid name (up to 63 letters, digits, '-', '_', '.')"
    return None


def _decodes_to_pem(value: str) -> bool:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return b"-----BEGIN" in raw


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------


@dataclass
class Checker:
    report: Report
    version: Version | None
    prefix: str = ""

    def at(self, path: str) -> str:
        return f"{self.prefix}{path}" if path else (self.prefix.rstrip(":. ") or "(document)")

    def error(self, path: str, message: str, line: int | None) -> None:
        self.report.error(self.at(path), message, line)

    def warning(self, path: str, message: str, line: int | None) -> None:
        self.report.warning(self.at(path), message, line)

    # -- generic shape checks ----------------------------------------------------------

    def duplicates(self, obj: Any, path: str = "", policy: bool = False) -> None:
        """Strict decoding refuses a field given twice; PyYAML would keep the last one."""
        consequence = (
            "only one of them counts, or a strict decoder refuses the file"
            if policy
            else "strict decoding error; kube-scheduler does not start"
        )
        if isinstance(obj, _Map):
            for key, line in obj.duplicates:
                self.error(_join(path, key), f'duplicate field "{key}" ({consequence})', line)
            for key, value in obj.items():
                self.duplicates(value, _join(path, key), policy)
        elif isinstance(obj, list):
            for index, value in enumerate(obj):
                self.duplicates(value, _join(path, index), policy)

    def unknown_fields(
        self,
        obj: _Map,
        path: str,
        known: tuple[str, ...],
        what: str,
        form: Form,
        strict: bool = True,
        ignore: tuple[str, ...] = (),
    ) -> None:
        """Report keys the decoder does not know; a near miss of a known one is an error
        whatever the decoder, because the setting the user meant is lost."""
        for key in obj:
            if key in known or key in ignore:
                continue
            name = str(key)
            line = _line(obj, key)
            same_case = [k for k in known if k.lower() == name.lower()]
            close = same_case or difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                spelled = close[0]
                if form.policy:
                    consequence = "field names are case-sensitive: the setting is lost, or refused"
                else:
                    consequence = "strict decoding error; kube-scheduler does not start"
                self.error(
                    _join(path, key),
                    f'unknown field "{name}": {form.name} spells it {spelled} ({consequence})',
                    line,
                )
            elif strict and not form.policy:
                hint = ""
                if name == "apiVersion":
                    hint = " (GAS's Policy sample has one in each extender; remove it)"
                self.error(
                    _join(path, key),
                    f'unknown field "{name}" in {what} (strict decoding error; kube-scheduler '
                    f"does not start){hint}",
                    line,
                )
            elif form.policy:
                self.warning(
                    _join(path, key),
                    f'unknown field "{name}" in {what}: not part of the Policy format; remove '
                    "it (a strict decoder refuses it, as kube-scheduler does in a "
                    "KubeSchedulerConfiguration)",
                    line,
                )
            else:
                self.warning(
                    _join(path, key),
                    f'unknown field "{name}" in {what} (kube-scheduler decodes strictly and '
                    "refuses fields it does not know)",
                    line,
                )

    def expect_type(self, obj: _Map, key: str, path: str, kind: type, what: str) -> bool:
        """True if ``obj[key]`` is present and of the type the Go field decodes."""
        value = obj.get(key)
        if value is None:
            return False
        ok = _is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            self.error(
                _join(path, key),
                f"must be {what}, not {_type_name(value)} {value!r} (decoding error; "
                "kube-scheduler does not start)",
                _line(obj, key),
            )
        return ok

    # -- versions ------------------------------------------------------------------------

    def versions(self, form: Form, path: str, line: int | None) -> None:
        if self.version is not None:
            current = _v(self.version)
            if form.since is not None and self.version < form.since:
                self.error(
                    path,
                    f"Kubernetes {current} does not know {form.name} (added in {_v(form.since)})",
                    line,
                )
            elif form.removed is not None and self.version >= form.removed:
                self.error(
                    path,
                    f"{form.name} was removed in Kubernetes {_v(form.removed)}: "
                    f"{current} refuses it; {_replacement(self.version)}",
                    line,
                )
            elif form.deprecated is not None and self.version >= form.deprecated:
                self.warning(
                    path,
                    f"{form.name} is deprecated since Kubernetes {_v(form.deprecated)} and "
                    f"removed in {_v(form.removed or form.deprecated)}; use "
                    "kubescheduler.config.k8s.io/v1",
                    line,
                )
            return
        if form.removed is not None:
            since = f"{_v(form.since)} to " if form.since else "up to "
            last = (form.removed[0], form.removed[1] - 1)
            self.warning(
                path,
                f"{form.name} works only on Kubernetes {since}{_v(last)} (removed in "
                f"{_v(form.removed)}); use kubescheduler.config.k8s.io/v1 on 1.25+, or pass "
                "--kubernetesVersion to check against your cluster",
                line,
            )

    # -- the two top-level formats -------------------------------------------------------

    def scheduler_configuration(self, doc: _Map, form: Form) -> None:
        self.duplicates(doc)
        self.versions(form, "apiVersion", _line(doc, "apiVersion"))
        if "kubeconfig" in doc:
            self.error(
                "kubeconfig",
                'unknown field "kubeconfig": it belongs under clientConnection.kubeconfig '
                "(strict decoding error; kube-scheduler does not start)",
                _line(doc, "kubeconfig"),
            )
        self.unknown_fields(
            doc,
            "",
            CONFIG_FIELDS + form.extra_fields,
            "a KubeSchedulerConfiguration",
            form,
            strict=False,
            ignore=("kubeconfig",),
        )
        self.client_connection(doc, form)
        profiles = doc.get("profiles")
        if isinstance(profiles, list):
            for index, profile in enumerate(profiles):
                if isinstance(profile, _Map) and "extenders" in profile:
                    self.error(
                        _join(_join("profiles", index), "extenders"),
                        "extenders is a top-level field shared by all profiles, not a "
                        "profile field (strict decoding error; kube-scheduler does not start)",
                        _line(profile, "extenders"),
                    )
        self.extenders(doc, form)

    def client_connection(self, doc: _Map, form: Form) -> None:
        connection = doc.get("clientConnection")
        consequence = (
            "with --config, kube-scheduler ignores its --kubeconfig flag and falls back to "
            "the in-cluster configuration, which a kubeadm static pod does not have; set "
            "clientConnection.kubeconfig (e.g. /etc/kubernetes/scheduler.conf)"
        )
        if connection is None:
            self.warning("clientConnection", f"missing: {consequence}", doc.line)
            return
        if not isinstance(connection, _Map):
            self.error(
                "clientConnection",
                f"must be a mapping, not {_type_name(connection)}",
                _line(doc, "clientConnection"),
            )
            return
        self.unknown_fields(
            connection,
            "clientConnection",
            CLIENT_CONNECTION_FIELDS,
            "clientConnection",
            form,
        )
        kubeconfig = connection.get("kubeconfig")
        if kubeconfig is not None and not isinstance(kubeconfig, str):
            self.expect_type(connection, "kubeconfig", "clientConnection", str, "a string")
        elif not kubeconfig:
            self.warning(
                "clientConnection.kubeconfig",
                f"empty: {consequence}",
                _line(connection, "kubeconfig"),
            )

    def policy(self, doc: _Map) -> None:
        self.duplicates(doc, policy=True)
        self.versions(POLICY, "kind", _line(doc, "kind"))
        if doc.get("apiVersion") != "v1":
            self.error(
                "apiVersion",
                f'a Policy has apiVersion "v1", not {doc.get("apiVersion")!r}',
                _line(doc, "apiVersion"),
            )
        self.unknown_fields(doc, "", POLICY_FIELDS, "a Policy", POLICY, strict=False)
        predicates = doc.get("predicates")
        if isinstance(predicates, list) and not predicates:
            self.warning(
                "predicates",
                "an empty list turns off every default predicate (resources, taints, "
                "affinity...): leave predicates out to keep the defaults",
                _line(doc, "predicates"),
            )
        self.extenders(doc, POLICY)

    # -- extenders -----------------------------------------------------------------------

    def extenders(self, doc: _Map, form: Form) -> None:
        extenders = doc.get("extenders")
        if extenders is None or extenders == []:
            self.error("extenders", "no extenders: gas is not registered", doc.line)
            return
        if not isinstance(extenders, list):
            self.error(
                "extenders",
                f"must be a list, not {_type_name(extenders)}",
                _line(doc, "extenders"),
            )
            return
        entries: list[tuple[int, _Map]] = []
        for index, entry in enumerate(extenders):
            if isinstance(entry, _Map):
                entries.append((index, entry))
            else:
                self.error(
                    _join("extenders", index),
                    f"an extender must be a mapping, not {_type_name(entry)}",
                    _line(extenders),
                )
        for index, entry in entries:
            self.extender(entry, _join("extenders", index), form)
        self.binders(entries)
        self.managed_names(entries)
        gas = _gas_extenders(entries)
        if not gas:
            self.error(
                "extenders",
                f"no extender looks like gas: none manages {I915} or points at a gas URL",
                _line(doc, "extenders"),
            )
        for index, entry in gas:
            self.gas_extender(entry, _join("extenders", index), form)

    def extender(self, entry: _Map, path: str, form: Form) -> None:
        known = (*EXTENDER_FIELDS, form.https_field)
        self.unknown_fields(entry, path, known, "an extender entry", form)
        for key in ("urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb"):
            self.expect_type(entry, key, path, str, "a string")
        for key in (form.https_field, "nodeCacheCapable", "ignorable"):
            self.expect_type(entry, key, path, bool, "true or false")
        self.url(entry, path)
        for key in ("filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb"):
            verb = entry.get(key)
            if isinstance(verb, str) and verb.startswith("/"):
                self.error(
                    _join(path, key),
                    f"{verb!r} starts with '/': kube-scheduler appends '/' + verb to "
                    f"urlPrefix, so the URL gets '//'; write {verb.lstrip('/')!r}",
                    _line(entry, key),
                )
        self.weight(entry, path)
        self.timeout(entry, path, form)
        self.tls(entry, path, form)
        self.managed_resources(entry, path, form)

    def url(self, entry: _Map, path: str) -> None:
        url = entry.get("urlPrefix")
        where = _join(path, "urlPrefix")
        line = _line(entry, "urlPrefix")
        if url is None:
            self.error(where, "missing: an extender needs a urlPrefix", entry.line)
            return
        if not isinstance(url, str):
            return
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            self.error(where, f"{url!r} is not a valid URL ({exc})", line)
            return
        if parts.scheme == "http":
            self.error(
                where,
                f"{url!r} is plain HTTP: the scheme comes from urlPrefix alone "
                "(enableHTTPS does not turn http:// into https://), and gas serves HTTPS; "
                "use https://",
                line,
            )
        elif parts.scheme != "https":
            self.error(where, f"{url!r} must start with https://", line)
            return
        if not parts.hostname:
            self.error(where, f"{url!r} has no host", line)
        if parts.query or parts.fragment or "?" in url or "#" in url:
            self.error(
                where,
                f"{url!r} has a query string or fragment: kube-scheduler appends '/' + verb "
                "after it, so the verb would end up inside the query",
                line,
            )

    def weight(self, entry: _Map, path: str) -> None:
        if "weight" in entry and not self.expect_type(entry, "weight", path, int, "an integer"):
            return
        if entry.get("prioritizeVerb"):
            weight = entry.get("weight")
            if not isinstance(weight, int) or weight <= 0:
                self.error(
                    _join(path, "weight"),
                    f"must be > 0 when prioritizeVerb is set, "
                    f"{'not ' + repr(weight) if weight is not None else 'and it is missing'} "
                    "(validation error; kube-scheduler does not start)",
                    _line(entry, "weight") if "weight" in entry else entry.line,
                )

    def timeout(self, entry: _Map, path: str, form: Form) -> None:
        if "httpTimeout" not in entry:
            return
        value = entry["httpTimeout"]
        where = _join(path, "httpTimeout")
        line = _line(entry, "httpTimeout")
        ns: int | None
        if form.policy:
            if not _is_int(value):
                self.error(
                    where,
                    f"in a Policy, httpTimeout is an integer number of nanoseconds (10s is "
                    f"10000000000), not {_type_name(value)} {value!r} (decoding error)",
                    line,
                )
                return
            ns = value
        else:
            if _is_int(value) or isinstance(value, float):
                self.error(
                    where,
                    f'must be a duration string such as "10s", not the number {value!r} '
                    "(numbers were the old Policy format; strict decoding error, "
                    "kube-scheduler does not start)",
                    line,
                )
                return
            ns = parse_go_duration(value) if isinstance(value, str) else None
            if ns is None:
                self.error(
                    where,
                    f'{value!r} is not a duration (write e.g. "10s" or "1m30s"; '
                    "decoding error, kube-scheduler does not start)",
                    line,
                )
                return
        if ns < 0:
            self.warning(
                where,
                "negative: the calls get no timeout at all, so a hung gas stalls scheduling",
                line,
            )
        elif 0 < ns < _SECOND:
            unit = (
                f" (Policy timeouts are nanoseconds: {value} ns; 10s is 10000000000)"
                if form.policy
                else ""
            )
            self.warning(
                where,
                f"{_format_ns(ns)} is very short{unit}: it covers the whole call, and bind "
                "creates an API object within it",
                line,
            )

    def tls(self, entry: _Map, path: str, form: Form) -> None:
        tls_path = _join(path, "tlsConfig")
        config = entry.get("tlsConfig")
        if config is not None and not isinstance(config, _Map):
            self.expect_type(entry, "tlsConfig", path, dict, "a mapping")
            return
        config = config if config is not None else _Map()
        self.unknown_fields(config, tls_path, TLS_FIELDS, "tlsConfig", form)
        self.expect_type(config, "insecure", tls_path, bool, "true or false")
        for key in TLS_FIELDS[1:]:
            self.expect_type(config, key, tls_path, str, "a string")
        for key in ("certData", "keyData", "caData"):
            value = config.get(key)
            if isinstance(value, str) and value and not _decodes_to_pem(value):
                self.error(
                    _join(tls_path, key),
                    "must be the base64 encoding of PEM data (e.g. base64 -w0 < file), not "
                    "PEM text or a path",
                    _line(config, key),
                )
        has_ca = bool(config.get("caFile") or config.get("caData"))
        insecure = config.get("insecure") is True
        has_cert = bool(config.get("certFile") or config.get("certData"))
        has_key = bool(config.get("keyFile") or config.get("keyData"))
        if has_cert != has_key:
            given, missing = ("certFile", "keyFile") if has_cert else ("keyFile", "certFile")
            self.error(
                tls_path,
                f"{given} without {missing}: kube-scheduler sends no client certificate, and "
                "gas with --cacert refuses the connection",
                _line(entry, "tlsConfig") or entry.line,
            )
        if insecure and has_ca:
            self.error(
                _join(tls_path, "insecure"),
                "insecure: true together with caFile/caData is a startup error ('specifying "
                "a root certificates file with the insecure flag is not allowed')",
                _line(config, "insecure"),
            )
            return
        url = entry.get("urlPrefix")
        if not (isinstance(url, str) and url.startswith("https://")):
            return
        if has_ca:
            self.server_name(entry, config, tls_path, url)
            return
        line = _line(entry, "tlsConfig") or entry.line
        if insecure:
            self.warning(
                _join(tls_path, "insecure"),
                "the server certificate is not checked: anyone who can take over the "
                "address sees every pod and decides every binding; give caFile instead",
                _line(config, "insecure"),
            )
        elif entry.get(form.https_field) is True:
            self.warning(
                tls_path,
                f"{form.https_field} without caFile/caData turns OFF the server certificate "
                "check (it does not mean 'use HTTPS'); set caFile to the CA that signed "
                "gas's certificate",
                line,
            )
        else:
            self.warning(
                tls_path,
                "no caFile/caData: the server certificate is checked against the system root "
                "CAs only, which do not hold a private CA such as the one from gas certs; "
                "set caFile",
                line,
            )

    def server_name(self, entry: _Map, config: _Map, tls_path: str, url: str) -> None:
        if config.get("serverName"):
            return
        try:
            host = urlsplit(url).hostname or ""
            ipaddress.ip_address(host)
        except ValueError:
            return
        self.warning(
            tls_path,
            f"urlPrefix uses the IP address {host} and tlsConfig has no serverName: gas's "
            "certificate must then carry that IP (gas certs --ip); or set serverName to one "
            "of its DNS names",
            _line(entry, "tlsConfig") or _line(entry, "urlPrefix"),
        )

    def managed_resources(self, entry: _Map, path: str, form: Form) -> None:
        resources = entry.get("managedResources")
        if resources is None:
            return
        if not isinstance(resources, list):
            self.expect_type(entry, "managedResources", path, list, "a list")
            return
        for index, resource in enumerate(resources):
            where = _join(_join(path, "managedResources"), index)
            if not isinstance(resource, _Map):
                self.error(
                    where,
                    f"must be a mapping with name and ignoredByScheduler, not "
                    f"{_type_name(resource)}",
                    _line(resources),
                )
                continue
            self.unknown_fields(
                resource, where, MANAGED_RESOURCE_FIELDS, "a managed resource", form
            )
            self.expect_type(resource, "ignoredByScheduler", where, bool, "true or false")
            name = resource.get("name")
            if name is None:
                self.error(where, "missing name", resource.line)
            elif self.expect_type(resource, "name", where, str, "a string"):
                problem = extended_resource_problem(name)
                if problem is not None:
                    self.error(
                        _join(where, "name"),
                        f"{name!r} is not a valid extended resource name: {problem} "
                        "(validation error; kube-scheduler does not start)",
                        _line(resource, "name"),
                    )

    def binders(self, entries: list[tuple[int, _Map]]) -> None:
        binders = [
            (i, e) for i, e in entries if isinstance(e.get("bindVerb"), str) and e["bindVerb"]
        ]
        for index, entry in binders[1:]:
            self.error(
                _join(_join("extenders", index), "bindVerb"),
                f"only one extender can implement bind; extenders[{binders[0][0]}] already "
                "does (validation error; kube-scheduler does not start)",
                _line(entry, "bindVerb"),
            )

    def managed_names(self, entries: list[tuple[int, _Map]]) -> None:
        seen: dict[str, str] = {}
        for index, entry in entries:
            resources = entry.get("managedResources")
            if not isinstance(resources, list):
                continue
            for position, resource in enumerate(resources):
                if not isinstance(resource, _Map) or not isinstance(resource.get("name"), str):
                    continue
                name = resource["name"]
                where = _join(_join(_join("extenders", index), "managedResources"), position)
                if name in seen:
                    self.error(
                        _join(where, "name"),
                        f"{name} is already managed at {seen[name]}: a resource may appear "
                        "only once across all extenders (validation error)",
                        _line(resource, "name"),
                    )
                else:
                    seen[name] = where

    def gas_extender(self, entry: _Map, path: str, form: Form) -> None:
        url = entry.get("urlPrefix")
        prefix_path: str | None = None
        if isinstance(url, str):
            with contextlib.suppress(ValueError):
                parts = urlsplit(url)
                if parts.scheme in ("http", "https") and parts.hostname:
                    prefix_path = parts.path.rstrip("/")
        for key, route in GAS_ROUTES.items():
            verb = entry.get(key)
            if not verb:
                consequence = (
                    "GPU pods are never filtered by gas and land on cards that are full"
                    if key == "filterVerb"
                    else "gas never binds, so no cards are chosen and the pod's "
                    "gas-container-cards annotation is never written"
                )
                self.error(
                    _join(path, key),
                    f"missing: set {key}: {route.lstrip('/')!r} ({consequence})",
                    entry.line,
                )
            elif isinstance(verb, str) and not verb.startswith("/") and prefix_path is not None:
                target = f"{prefix_path}/{verb}"
                if target != route:
                    self.error(
                        _join(path, key),
                        f"the call goes to {target}, but gas serves POST {route}",
                        _line(entry, key),
                    )
        prioritize = entry.get("prioritizeVerb")
        if isinstance(prioritize, str) and prioritize and not prioritize.startswith("/"):
            scored = f"{prefix_path}/{prioritize}" if prefix_path is not None else None
            if scored is not None and scored != PRIORITIZE_ROUTE:
                # kube-scheduler ignores prioritize errors, so this fails silently.
                self.warning(
                    _join(path, "prioritizeVerb"),
                    f"the call goes to {scored}, but gas serves POST {PRIORITIZE_ROUTE}; "
                    "every score would be lost",
                    _line(entry, "prioritizeVerb"),
                )
        preempt = entry.get("preemptVerb")
        if isinstance(preempt, str) and preempt and not preempt.startswith("/"):
            preempted = f"{prefix_path}/{preempt}" if prefix_path is not None else None
            if preempted is not None and preempted != PREEMPT_ROUTE:
                if entry.get("ignorable") is True:
                    # An ignorable extender's failed preempt call is skipped.
                    self.warning(
                        _join(path, "preemptVerb"),
                        f"the call goes to {preempted}, but gas serves POST {PREEMPT_ROUTE}; "
                        "preemption would go ahead without gas's card check",
                        _line(entry, "preemptVerb"),
                    )
                else:
                    self.error(
                        _join(path, "preemptVerb"),
                        f"the call goes to {preempted}, but gas serves POST {PREEMPT_ROUTE}; "
                        "every call fails, which aborts preemption for GPU pods",
                        _line(entry, "preemptVerb"),
                    )
        if entry.get("nodeCacheCapable") is not True:
            self.warning(
                _join(path, "nodeCacheCapable"),
                "not true: kube-scheduler sends every candidate Node object in full with each "
                "call (large bodies, slow calls); gas keeps its own node cache, so set "
                "nodeCacheCapable: true",
                _line(entry, "nodeCacheCapable") or entry.line,
            )
        if entry.get("ignorable") is True:
            if entry.get("bindVerb"):
                message = (
                    "true on the binder: ignorable has no effect on bind (binds still fail "
                    "while gas is down), and it makes kube-scheduler skip gas's filter "
                    "when gas errs, so pods can be sent to bind on nodes gas never "
                    "approved; set ignorable: false"
                )
            else:
                message = (
                    "true: when gas errs kube-scheduler skips its filter, and GPU pods land "
                    "on cards that are already full; set ignorable: false"
                )
            self.warning(_join(path, "ignorable"), message, _line(entry, "ignorable"))
        resources = entry.get("managedResources")
        names = set()
        if isinstance(resources, list):
            names = {r.get("name") for r in resources if isinstance(r, _Map)}
        where = _join(path, "managedResources")
        line = _line(entry, "managedResources") or entry.line
        if not names:
            self.warning(
                where,
                "empty: kube-scheduler then sends every pod to gas, and gas binds every pod "
                f"of the cluster; list {I915} and {XE}",
                line,
            )
            return
        if I915 not in names:
            self.error(
                where,
                f"{I915} is missing: pods that ask for it never reach gas",
                line,
            )
        if XE not in names:
            self.warning(
                where,
                f"{XE} is missing: pods that ask only for xe GPUs bypass gas",
                line,
            )

    # -- the Policy ConfigMap and its RBAC -----------------------------------------------

    def policy_configmap(
        self, doc: _Map, text: str | None, offset: int, rbac: list[_Map] | None
    ) -> None:
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), _Map) else _Map()
        assert isinstance(metadata, _Map)
        namespace = metadata.get("namespace")
        name = metadata.get("name")
        if namespace is None:
            self.warning(
                "metadata.namespace",
                "missing: the ConfigMap lands in the current namespace, but kube-scheduler "
                "reads kube-system (unless --policy-configmap-namespace says otherwise)",
                metadata.line or doc.line,
            )
        elif namespace != "kube-system":
            self.warning(
                "metadata.namespace",
                f"{namespace!r}: kube-scheduler reads the policy ConfigMap from kube-system "
                "unless started with --policy-configmap-namespace",
                _line(metadata, "namespace"),
            )
        if rbac is not None and isinstance(name, str):
            ns = namespace if isinstance(namespace, str) else "kube-system"
            if not _can_get_configmap(rbac, SCHEDULER_USER, ns, name):
                self.error(
                    "metadata.name",
                    f"none of the RBAC objects given lets user {SCHEDULER_USER} get "
                    f"ConfigMap {ns}/{name}, so kube-scheduler cannot load the policy",
                    _line(metadata, "name"),
                )
        if text is None:
            return
        inner = Checker(self.report, self.version, f"{self.prefix}data[{POLICY_KEY}].")
        try:
            documents = [d for d in parse_documents(text, offset) if d is not None]
        except ParseError as exc:
            self.error(f"data[{POLICY_KEY}]", str(exc), exc.line)
            return
        if len(documents) != 1 or not isinstance(documents[0], _Map):
            self.error(f"data[{POLICY_KEY}]", "must hold one JSON Policy object", doc.line)
            return
        policy = documents[0]
        if policy.get("kind") != "Policy":
            inner.error(
                "kind", f'must be "Policy", not {policy.get("kind")!r}', _line(policy, "kind")
            )
        inner.policy(policy)


def _replacement(version: Version) -> str:
    if version >= (1, 25):
        return "use kubescheduler.config.k8s.io/v1"
    if version >= (1, 23):
        return "use kubescheduler.config.k8s.io/v1beta3"
    return "use the Policy ConfigMap"


def _gas_extenders(entries: list[tuple[int, _Map]]) -> list[tuple[int, _Map]]:
    """The extenders that are gas: those managing gpu.intel.com resources; else those whose
    URL names gas; else the only extender, if it manages nothing (so is asked about every
    pod)."""

    def manages_gpus(entry: _Map) -> bool:
        resources = entry.get("managedResources")
        return isinstance(resources, list) and any(
            isinstance(r, _Map) and str(r.get("name", "")).startswith(GPU_PREFIX) for r in resources
        )

    def named_gas(entry: _Map) -> bool:
        url = entry.get("urlPrefix")
        host = ""
        if isinstance(url, str):
            with contextlib.suppress(ValueError):
                host = urlsplit(url).hostname or ""
        first = host.split(".")[0]
        return "gas" in first or "gpu" in first

    by_resources = [(i, e) for i, e in entries if manages_gpus(e)]
    if by_resources:
        return by_resources
    by_name = [(i, e) for i, e in entries if named_gas(e)]
    if by_name:
        return by_name
    if len(entries) == 1 and not entries[0][1].get("managedResources"):
        return entries
    return []


def _can_get_configmap(rbac: list[_Map], user: str, namespace: str, name: str) -> bool:
    def grants(role: _Map) -> bool:
        rules = role.get("rules")
        if not isinstance(rules, list):
            return False
        for rule in rules:
            if not isinstance(rule, dict):
                continue
            groups = rule.get("apiGroups") or []
            resources = rule.get("resources") or []
            verbs = rule.get("verbs") or []
            names = rule.get("resourceNames") or []
            if (
                ("" in groups or "*" in groups)
                and ("configmaps" in resources or "*" in resources)
                and ("get" in verbs or "*" in verbs)
                and (not names or name in names)
            ):
                return True
        return False

    def meta(obj: _Map) -> dict[str, Any]:
        value = obj.get("metadata")
        return value if isinstance(value, dict) else {}

    roles = {
        (obj.get("kind"), meta(obj).get("namespace"), meta(obj).get("name")): obj
        for obj in rbac
        if obj.get("kind") in ("Role", "ClusterRole")
    }
    for binding in rbac:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        binding_ns = meta(binding).get("namespace")
        if kind == "RoleBinding" and binding_ns != namespace:
            continue
        subjects = binding.get("subjects") or []
        if not any(
            isinstance(s, dict) and s.get("kind") == "User" and s.get("name") == user
            for s in subjects
        ):
            continue
        ref = binding.get("roleRef")
        if not isinstance(ref, dict):
            continue
        if ref.get("kind") == "ClusterRole":
            role = roles.get(("ClusterRole", None, ref.get("name")))
        elif ref.get("kind") == "Role" and kind == "RoleBinding":
            role = roles.get(("Role", binding_ns, ref.get("name")))
        else:
            role = None
        if role is not None and grants(role):
            return True
    return False


# --------------------------------------------------------------------------------------
# Files and documents
# --------------------------------------------------------------------------------------


@dataclass
class _Source:
    label: str
    documents: list[Any]


def _policy_text(doc: _Map) -> tuple[str | None, int, str | None]:
    """(policy text, line offset, key problem) for a ConfigMap."""
    data = doc.get("data")
    if not isinstance(data, _Map):
        return None, 0, None
    if POLICY_KEY in data:
        value = data[POLICY_KEY]
        if not isinstance(value, str):
            return None, 0, f"data[{POLICY_KEY}] must be a string holding the Policy JSON"
        line, style = data.value_lines.get(POLICY_KEY, (1, None))
        # A block scalar's text starts on the line after its indicator.
        offset = line if style in ("|", ">") else line - 1
        return value, offset, None
    for key, value in data.items():
        if isinstance(value, str) and ('"Policy"' in value or "kind: Policy" in value):
            return (
                None,
                0,
                f"the Policy is under data[{key}], but kube-scheduler reads only the key "
                f"{POLICY_KEY}",
            )
    return None, 0, None


def check(sources: list[_Source], version: Version | None) -> Report:
    report = Report()
    several_files = len(sources) > 1
    rbac = [
        doc
        for source in sources
        for doc in source.documents
        if isinstance(doc, _Map) and doc.get("kind") in RBAC_KINDS
    ]
    found = False
    for source in sources:
        documents = [d for d in source.documents if d is not None]
        for number, doc in enumerate(documents, start=1):
            prefix = f"{source.label}:" if several_files else ""
            if len(documents) > 1:
                prefix += f"doc{number}:"
            checker = Checker(report, version, prefix)
            if not isinstance(doc, _Map):
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
                        _line(doc, "apiVersion"),
                    )
                    form = FORMS[CONFIG_GROUP + "v1"]
                checker.scheduler_configuration(doc, form)
            elif kind == "Policy":
                found = True
                checker.policy(doc)
            elif kind == "ConfigMap":
                text, offset, problem = _policy_text(doc)
                if problem is not None:
                    found = True
                    checker.error("data", problem, _line(doc, "data"))
                elif text is not None:
                    found = True
                    checker.duplicates(doc, policy=True)
                    checker.policy_configmap(doc, text, offset, rbac or None)
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
        if not _can_get_configmap(rbac, SCHEDULER_USER, "kube-system", POLICY_CONFIGMAP):
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


# --------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------


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
    sources: list[_Source] = []
    parse_report = Report()
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"gas check-config: cannot read {path}: {reason}", file=sys.stderr)
            return 2
        try:
            sources.append(_Source(path, parse_documents(text)))
        except ParseError as exc:
            parse_report.error(path, str(exc), exc.line)
    report = parse_report if parse_report.findings else check(sources, version)
    for finding in report.findings:
        print(finding)
    if not report.findings:
        print("OK")
    return 1 if report.failed else 0
