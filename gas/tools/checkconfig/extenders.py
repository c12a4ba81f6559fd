"""The extender entries: the rules for every entry (fields, URL, weight, timeout, TLS,
managed resources), across entries (one binder, each resource managed once), and for the
entry that is gas (its routes and the settings gas needs)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import ipaddress
from urllib.parse import urlsplit

from gas.core.durations import NANOSECONDS_PER_SECOND, format_seconds, parse_go_duration
from gas.core.model import ANNOTATION_CARDS, BINPACK, I915, RESOURCE_PREFIX, SPREAD, XE
from gas.serving import routes
from gas.tools.certs import LOOPBACK_IPS
from gas.tools.checkconfig.checker import Checker
from gas.tools.checkconfig.load import LocatedMap, join_path, line_of
from gas.tools.checkconfig.values import Form, extended_resource_problem, is_int, type_name

# The verbs gas must serve, and where kube-scheduler must send them.
GAS_ROUTES = {"filterVerb": routes.FILTER, "bindVerb": routes.BIND}
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
# gas serve's policies that choose the node, through the prioritize verb.
SCORING_POLICIES = (BINPACK, SPREAD)


def check_extenders(
    checker: Checker, doc: LocatedMap, form: Form, gas_policy: str | None = None
) -> None:
    """The ``extenders`` list of a configuration or Policy: every entry, the rules across
    entries, and the entries that are gas; ``gas_policy`` is `gas serve --policy` when the
    Deployment that runs gas was given too."""
    extenders = doc.get("extenders")
    if extenders is None or extenders == []:
        checker.error("extenders", "no extenders: gas is not registered", doc.line)
        return
    if not isinstance(extenders, list):
        checker.error(
            "extenders",
            f"must be a list, not {type_name(extenders)}",
            line_of(doc, "extenders"),
        )
        return
    entries: list[tuple[int, LocatedMap]] = []
    for index, entry in enumerate(extenders):
        if isinstance(entry, LocatedMap):
            entries.append((index, entry))
        else:
            checker.error(
                join_path("extenders", index),
                f"an extender must be a mapping, not {type_name(entry)}",
                line_of(extenders),
            )
    for index, entry in entries:
        _extender(checker, entry, join_path("extenders", index), form)
    _binders(checker, entries)
    _managed_names(checker, entries)
    gas = _gas_extenders(entries)
    if not gas:
        checker.error(
            "extenders",
            f"no extender looks like gas: none manages {I915} or points at a gas URL",
            line_of(doc, "extenders"),
        )
    for index, entry in gas:
        _gas_extender(checker, entry, join_path("extenders", index), gas_policy)


def _extender(checker: Checker, entry: LocatedMap, path: str, form: Form) -> None:
    known = (*EXTENDER_FIELDS, form.https_field)
    checker.unknown_fields(entry, path, known, "an extender entry", form)
    for key in ("urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb"):
        checker.expect_type(entry, key, path, str, "a string")
    for key in (form.https_field, "nodeCacheCapable", "ignorable"):
        checker.expect_type(entry, key, path, bool, "true or false")
    _url(checker, entry, path)
    for key in ("filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb"):
        verb = entry.get(key)
        if isinstance(verb, str) and verb.startswith("/"):
            checker.error(
                join_path(path, key),
                f"{verb!r} starts with '/': kube-scheduler appends '/' + verb to "
                f"urlPrefix, so the URL gets '//'; write {verb.lstrip('/')!r}",
                line_of(entry, key),
            )
    _weight(checker, entry, path)
    _timeout(checker, entry, path, form)
    _tls(checker, entry, path, form)
    _managed_resources(checker, entry, path, form)


def _url(checker: Checker, entry: LocatedMap, path: str) -> None:
    url = entry.get("urlPrefix")
    where = join_path(path, "urlPrefix")
    line = line_of(entry, "urlPrefix")
    if url is None:
        checker.error(where, "missing: an extender needs a urlPrefix", entry.line)
        return
    if not isinstance(url, str):
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        checker.error(where, f"{url!r} is not a valid URL ({exc})", line)
        return
    if parts.scheme == "http":
        checker.error(
            where,
            f"{url!r} is plain HTTP: the scheme comes from urlPrefix alone "
            "(enableHTTPS does not turn http:// into https://), and gas serves HTTPS; "
            "use https://",
            line,
        )
    elif parts.scheme != "https":
        checker.error(where, f"{url!r} must start with https://", line)
        return
    if not parts.hostname:
        checker.error(where, f"{url!r} has no host", line)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        checker.error(
            where,
            f"{url!r} has a query string or fragment: kube-scheduler appends '/' + verb "
            "after it, so the verb would end up inside the query",
            line,
        )


def _weight(checker: Checker, entry: LocatedMap, path: str) -> None:
    if "weight" in entry and not checker.expect_type(entry, "weight", path, int, "an integer"):
        return
    if entry.get("prioritizeVerb"):
        weight = entry.get("weight")
        if not isinstance(weight, int) or weight <= 0:
            checker.error(
                join_path(path, "weight"),
                f"must be > 0 when prioritizeVerb is set, "
                f"{'not ' + repr(weight) if weight is not None else 'and it is missing'} "
                "(validation error; kube-scheduler does not start)",
                line_of(entry, "weight") if "weight" in entry else entry.line,
            )


def _timeout(checker: Checker, entry: LocatedMap, path: str, form: Form) -> None:
    if "httpTimeout" not in entry:
        return
    value = entry["httpTimeout"]
    where = join_path(path, "httpTimeout")
    line = line_of(entry, "httpTimeout")
    ns: int | None
    if form.policy:
        if not is_int(value):
            checker.error(
                where,
                f"in a Policy, httpTimeout is an integer number of nanoseconds (10s is "
                f"10000000000), not {type_name(value)} {value!r} (decoding error)",
                line,
            )
            return
        ns = value
    else:
        if is_int(value) or isinstance(value, float):
            checker.error(
                where,
                f'must be a duration string such as "10s", not the number {value!r} '
                "(numbers were the old Policy format; strict decoding error, "
                "kube-scheduler does not start)",
                line,
            )
            return
        ns = parse_go_duration(value) if isinstance(value, str) else None
        if ns is None:
            checker.error(
                where,
                f'{value!r} is not a duration (write e.g. "10s" or "1m30s"; '
                "decoding error, kube-scheduler does not start)",
                line,
            )
            return
    if ns < 0:
        checker.warning(
            where,
            "negative: the calls get no timeout at all, so a hung gas stalls scheduling",
            line,
        )
    elif 0 < ns < NANOSECONDS_PER_SECOND:
        unit = (
            f" (Policy timeouts are nanoseconds: {value} ns; 10s is 10000000000)"
            if form.policy
            else ""
        )
        checker.warning(
            where,
            f"{format_seconds(ns)} is very short{unit}: it covers the whole call, and bind "
            "creates an API object within it",
            line,
        )


def _tls(checker: Checker, entry: LocatedMap, path: str, form: Form) -> None:
    tls_path = join_path(path, "tlsConfig")
    config = entry.get("tlsConfig")
    if config is not None and not isinstance(config, LocatedMap):
        checker.expect_type(entry, "tlsConfig", path, dict, "a mapping")
        return
    config = config if config is not None else LocatedMap()
    checker.unknown_fields(config, tls_path, TLS_FIELDS, "tlsConfig", form)
    checker.expect_type(config, "insecure", tls_path, bool, "true or false")
    for key in TLS_FIELDS[1:]:
        checker.expect_type(config, key, tls_path, str, "a string")
    for key in ("certData", "keyData", "caData"):
        value = config.get(key)
        if isinstance(value, str) and value and not _decodes_to_pem(value):
            checker.error(
                join_path(tls_path, key),
                "must be the base64 encoding of PEM data (e.g. base64 -w0 < file), not "
                "PEM text or a path",
                line_of(config, key),
            )
    has_ca = bool(config.get("caFile") or config.get("caData"))
    insecure = config.get("insecure") is True
    has_cert = bool(config.get("certFile") or config.get("certData"))
    has_key = bool(config.get("keyFile") or config.get("keyData"))
    if has_cert != has_key:
        given, missing = ("certFile", "keyFile") if has_cert else ("keyFile", "certFile")
        checker.error(
            tls_path,
            f"{given} without {missing}: kube-scheduler sends no client certificate, and "
            "gas with --cacert refuses the connection",
            line_of(entry, "tlsConfig") or entry.line,
        )
    if insecure and has_ca:
        checker.error(
            join_path(tls_path, "insecure"),
            "insecure: true together with caFile/caData is a startup error ('specifying "
            "a root certificates file with the insecure flag is not allowed')",
            line_of(config, "insecure"),
        )
        return
    url = entry.get("urlPrefix")
    if not (isinstance(url, str) and url.startswith("https://")):
        return
    if has_ca:
        _server_name(checker, entry, config, tls_path, url)
        return
    line = line_of(entry, "tlsConfig") or entry.line
    if insecure:
        checker.warning(
            join_path(tls_path, "insecure"),
            "the server certificate is not checked: anyone who can take over the "
            "address sees every pod and decides every binding; give caFile instead",
            line_of(config, "insecure"),
        )
    elif entry.get(form.https_field) is True:
        checker.warning(
            tls_path,
            f"{form.https_field} without caFile/caData turns OFF the server certificate "
            "check (it does not mean 'use HTTPS'); set caFile to the CA that signed "
            "gas's certificate",
            line,
        )
    else:
        checker.warning(
            tls_path,
            "no caFile/caData: the server certificate is checked against the system root "
            "CAs only, which do not hold a private CA such as the one from gas certs; "
            "set caFile",
            line,
        )


def _server_name(
    checker: Checker, entry: LocatedMap, config: LocatedMap, tls_path: str, url: str
) -> None:
    if config.get("serverName"):
        return
    try:
        host = urlsplit(url).hostname or ""
        ipaddress.ip_address(host)
    except ValueError:
        return
    if host in LOOPBACK_IPS:
        # `gas certs` always puts the loopback address in gas's certificate.
        return
    checker.warning(
        tls_path,
        f"urlPrefix uses the IP address {host} and tlsConfig has no serverName: gas's "
        "certificate must then carry that IP (gas certs --ip); or set serverName to one "
        "of its DNS names",
        line_of(entry, "tlsConfig") or line_of(entry, "urlPrefix"),
    )


def _managed_resources(checker: Checker, entry: LocatedMap, path: str, form: Form) -> None:
    resources = entry.get("managedResources")
    if resources is None:
        return
    if not isinstance(resources, list):
        checker.expect_type(entry, "managedResources", path, list, "a list")
        return
    for index, resource in enumerate(resources):
        where = join_path(join_path(path, "managedResources"), index)
        if not isinstance(resource, LocatedMap):
            checker.error(
                where,
                f"must be a mapping with name and ignoredByScheduler, not {type_name(resource)}",
                line_of(resources),
            )
            continue
        checker.unknown_fields(resource, where, MANAGED_RESOURCE_FIELDS, "a managed resource", form)
        checker.expect_type(resource, "ignoredByScheduler", where, bool, "true or false")
        name = resource.get("name")
        if name is None:
            checker.error(where, "missing name", resource.line)
        elif checker.expect_type(resource, "name", where, str, "a string"):
            problem = extended_resource_problem(name)
            if problem is not None:
                checker.error(
                    join_path(where, "name"),
                    f"{name!r} is not a valid extended resource name: {problem} "
                    "(validation error; kube-scheduler does not start)",
                    line_of(resource, "name"),
                )


def _binders(checker: Checker, entries: list[tuple[int, LocatedMap]]) -> None:
    binders = [(i, e) for i, e in entries if isinstance(e.get("bindVerb"), str) and e["bindVerb"]]
    for index, entry in binders[1:]:
        checker.error(
            join_path(join_path("extenders", index), "bindVerb"),
            f"only one extender can implement bind; extenders[{binders[0][0]}] already "
            "does (validation error; kube-scheduler does not start)",
            line_of(entry, "bindVerb"),
        )


def _managed_names(checker: Checker, entries: list[tuple[int, LocatedMap]]) -> None:
    seen: dict[str, str] = {}
    for index, entry in entries:
        resources = entry.get("managedResources")
        if not isinstance(resources, list):
            continue
        for position, resource in enumerate(resources):
            if not isinstance(resource, LocatedMap) or not isinstance(resource.get("name"), str):
                continue
            name = resource["name"]
            where = join_path(
                join_path(join_path("extenders", index), "managedResources"), position
            )
            if name in seen:
                checker.error(
                    join_path(where, "name"),
                    f"{name} is already managed at {seen[name]}: a resource may appear "
                    "only once across all extenders (validation error)",
                    line_of(resource, "name"),
                )
            else:
                seen[name] = where


def _gas_extender(checker: Checker, entry: LocatedMap, path: str, gas_policy: str | None) -> None:
    _gas_routes(checker, entry, path, gas_policy)
    _gas_settings(checker, entry, path)


def _verb_for(route: str, prefix_path: str | None) -> str:
    """The verb that reaches gas's ``route`` from a urlPrefix whose path is ``prefix_path``
    (kube-scheduler calls urlPrefix + '/' + verb)."""
    if prefix_path and route.startswith(prefix_path + "/"):
        return route[len(prefix_path) + 1 :]
    return route.lstrip("/")


def _gas_routes(checker: Checker, entry: LocatedMap, path: str, gas_policy: str | None) -> None:
    """Each verb must reach the route gas serves it on."""
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
                f"{ANNOTATION_CARDS} annotation is never written"
            )
            checker.error(
                join_path(path, key),
                f"missing: set {key}: {_verb_for(route, prefix_path)!r} ({consequence})",
                entry.line,
            )
        elif isinstance(verb, str) and not verb.startswith("/") and prefix_path is not None:
            target = f"{prefix_path}/{verb}"
            if target != route:
                checker.error(
                    join_path(path, key),
                    f"the call goes to {target}, but gas serves POST {route}",
                    line_of(entry, key),
                )
    prioritize = entry.get("prioritizeVerb")
    if not prioritize and gas_policy in SCORING_POLICIES:
        # Left out, as shipped, it costs first fit nothing; gas's own policy needs it.
        checker.warning(
            join_path(path, "prioritizeVerb"),
            f"missing, and gas runs --policy {gas_policy}, which chooses the node only "
            "through prioritize: its pods' nodes are kube-scheduler's choice, and gas warns "
            f"at each such bind (GPUPolicyNotScored); set prioritizeVerb: "
            f"{_verb_for(routes.PRIORITIZE, prefix_path)!r} and weight: 1",
            entry.line,
        )
    elif isinstance(prioritize, str) and prioritize and not prioritize.startswith("/"):
        scored = f"{prefix_path}/{prioritize}" if prefix_path is not None else None
        if scored is not None and scored != routes.PRIORITIZE:
            # kube-scheduler ignores prioritize errors, so this fails silently.
            checker.warning(
                join_path(path, "prioritizeVerb"),
                f"the call goes to {scored}, but gas serves POST {routes.PRIORITIZE}; "
                "every score would be lost",
                line_of(entry, "prioritizeVerb"),
            )
    preempt = entry.get("preemptVerb")
    if isinstance(preempt, str) and preempt and not preempt.startswith("/"):
        preempted = f"{prefix_path}/{preempt}" if prefix_path is not None else None
        if preempted is not None and preempted != routes.PREEMPT:
            if entry.get("ignorable") is True:
                # An ignorable extender's failed preempt call is skipped.
                checker.warning(
                    join_path(path, "preemptVerb"),
                    f"the call goes to {preempted}, but gas serves POST {routes.PREEMPT}; "
                    "preemption would go ahead without gas's card check",
                    line_of(entry, "preemptVerb"),
                )
            else:
                checker.error(
                    join_path(path, "preemptVerb"),
                    f"the call goes to {preempted}, but gas serves POST {routes.PREEMPT}; "
                    "every call fails, which aborts preemption for GPU pods",
                    line_of(entry, "preemptVerb"),
                )


def _gas_settings(checker: Checker, entry: LocatedMap, path: str) -> None:
    """The settings gas needs to be asked about every GPU pod, cheaply and reliably."""
    if entry.get("nodeCacheCapable") is not True:
        checker.warning(
            join_path(path, "nodeCacheCapable"),
            "not true: kube-scheduler sends every candidate Node object in full with each "
            "call (large bodies, slow calls); gas keeps its own node cache, so set "
            "nodeCacheCapable: true",
            line_of(entry, "nodeCacheCapable") or entry.line,
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
        checker.warning(join_path(path, "ignorable"), message, line_of(entry, "ignorable"))
    resources = entry.get("managedResources")
    names = set()
    if isinstance(resources, list):
        names = {r.get("name") for r in resources if isinstance(r, LocatedMap)}
    where = join_path(path, "managedResources")
    line = line_of(entry, "managedResources") or entry.line
    if not names:
        checker.warning(
            where,
            "empty: kube-scheduler then sends every pod to gas, and gas binds every pod "
            f"of the cluster; list {I915} and {XE}",
            line,
        )
        return
    if I915 not in names:
        checker.error(
            where,
            f"{I915} is missing: pods that ask for it never reach gas",
            line,
        )
    if XE not in names:
        checker.warning(
            where,
            f"{XE} is missing: pods that ask only for xe GPUs bypass gas",
            line,
        )


def gas_entries(doc: LocatedMap) -> list[tuple[int, LocatedMap]]:
    """The entries of ``doc``'s ``extenders`` that are gas, with their indexes."""
    extenders = doc.get("extenders")
    if not isinstance(extenders, list):
        return []
    return _gas_extenders([(i, e) for i, e in enumerate(extenders) if isinstance(e, LocatedMap)])


def _gas_extenders(entries: list[tuple[int, LocatedMap]]) -> list[tuple[int, LocatedMap]]:
    """The extenders that are gas: those managing gpu.intel.com resources; else those whose
    URL names gas; else the only extender, if it manages nothing (so is asked about every
    pod)."""

    def manages_gpus(entry: LocatedMap) -> bool:
        resources = entry.get("managedResources")
        return isinstance(resources, list) and any(
            isinstance(r, LocatedMap) and str(r.get("name", "")).startswith(RESOURCE_PREFIX)
            for r in resources
        )

    def named_gas(entry: LocatedMap) -> bool:
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


def _decodes_to_pem(value: str) -> bool:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return b"-----BEGIN" in raw
