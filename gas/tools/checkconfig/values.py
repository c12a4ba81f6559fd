"""Configuration formats and the rules for single values: types, versions, resource names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gas.core.model import I915

CONFIG_GROUP = "kubescheduler.config.k8s.io/"

Version = tuple[int, int]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


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


def type_name(value: Any) -> str:
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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_version(text: str) -> Version:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?", text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes version: {text!r} (expected e.g. 1.28 or v1.28.3)")
    return int(match.group(1)), int(match.group(2))


def version_text(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def extended_resource_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None if it is."""
    if "/" not in name:
        return f"an extended resource name needs a domain prefix (like {I915})"
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
