"""Findings, and the checker that collects them with the generic shape checks every part of
a configuration needs: fields given twice, unknown or misspelt fields, value types, and the
Kubernetes versions that load a format."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from gas.tools.checkconfig.load import LocatedMap, join_path, line_of
from gas.tools.checkconfig.values import Form, Version, is_int, type_name, version_text


@dataclass(frozen=True)
class ConfigFinding:
    """One problem of a configuration file, at a field path and, when known, a line."""

    severity: str  # "ERROR" or "WARNING"
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.severity} {self.path}: {self.message}{where}"


@dataclass
class ConfigReport:
    """The findings of `gas check-config`, in the order they are shown."""

    findings: list[ConfigFinding] = field(default_factory=list)

    def error(self, path: str, message: str, line: int | None = None) -> None:
        self.findings.append(ConfigFinding("ERROR", path, message, line))

    def warning(self, path: str, message: str, line: int | None = None) -> None:
        self.findings.append(ConfigFinding("WARNING", path, message, line))

    @property
    def failed(self) -> bool:
        return any(f.severity == "ERROR" for f in self.findings)


@dataclass
class Checker:
    """Collects findings into ``report`` for one document; ``prefix`` names the document (and
    the file) when there are several, ``version`` is the cluster's if given. The rules of
    each part of a configuration are functions of a checker, in the modules named for them."""

    report: ConfigReport
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
        if isinstance(obj, LocatedMap):
            for key, line in obj.duplicates:
                self.error(join_path(path, key), f'duplicate field "{key}" ({consequence})', line)
            for key, value in obj.items():
                self.duplicates(value, join_path(path, key), policy)
        elif isinstance(obj, list):
            for index, value in enumerate(obj):
                self.duplicates(value, join_path(path, index), policy)

    def unknown_fields(
        self,
        obj: LocatedMap,
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
            line = line_of(obj, key)
            same_case = [k for k in known if k.lower() == name.lower()]
            close = same_case or difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                spelled = close[0]
                if form.policy:
                    consequence = "field names are case-sensitive: the setting is lost, or refused"
                else:
                    consequence = "strict decoding error; kube-scheduler does not start"
                self.error(
                    join_path(path, key),
                    f'unknown field "{name}": {form.name} spells it {spelled} ({consequence})',
                    line,
                )
            elif strict and not form.policy:
                hint = ""
                if name == "apiVersion":
                    hint = " (GAS's Policy sample has one in each extender; remove it)"
                self.error(
                    join_path(path, key),
                    f'unknown field "{name}" in {what} (strict decoding error; kube-scheduler '
                    f"does not start){hint}",
                    line,
                )
            elif form.policy:
                self.warning(
                    join_path(path, key),
                    f'unknown field "{name}" in {what}: not part of the Policy format; remove '
                    "it (a strict decoder refuses it, as kube-scheduler does in a "
                    "KubeSchedulerConfiguration)",
                    line,
                )
            else:
                self.warning(
                    join_path(path, key),
                    f'unknown field "{name}" in {what} (kube-scheduler decodes strictly and '
                    "refuses fields it does not know)",
                    line,
                )

    def expect_type(self, obj: LocatedMap, key: str, path: str, kind: type, what: str) -> bool:
        """True if ``obj[key]`` is present and of the type the Go field decodes."""
        value = obj.get(key)
        if value is None:
            return False
        ok = is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            self.error(
                join_path(path, key),
                f"must be {what}, not {type_name(value)} {value!r} (decoding error; "
                "kube-scheduler does not start)",
                line_of(obj, key),
            )
        return ok

    # -- versions ------------------------------------------------------------------------

    def versions(self, form: Form, path: str, line: int | None) -> None:
        if self.version is not None:
            current = version_text(self.version)
            if form.since is not None and self.version < form.since:
                self.error(
                    path,
                    f"Kubernetes {current} does not know {form.name} "
                    f"(added in {version_text(form.since)})",
                    line,
                )
            elif form.removed is not None and self.version >= form.removed:
                self.error(
                    path,
                    f"{form.name} was removed in Kubernetes {version_text(form.removed)}: "
                    f"{current} refuses it; {_replacement(self.version)}",
                    line,
                )
            elif form.deprecated is not None and self.version >= form.deprecated:
                self.warning(
                    path,
                    f"{form.name} is deprecated since Kubernetes "
                    f"{version_text(form.deprecated)} and removed in "
                    f"{version_text(form.removed or form.deprecated)}; use "
                    "kubescheduler.config.k8s.io/v1",
                    line,
                )
            return
        if form.removed is not None:
            since = f"{version_text(form.since)} to " if form.since else "up to "
            last = (form.removed[0], form.removed[1] - 1)
            self.warning(
                path,
                f"{form.name} works only on Kubernetes {since}{version_text(last)} (removed in "
                f"{version_text(form.removed)}); use kubescheduler.config.k8s.io/v1 on 1.25+, "
                "or pass --kubernetesVersion to check against your cluster",
                line,
            )


def _replacement(version: Version) -> str:
    """What to use instead of a format that ``version`` no longer loads."""
    if version >= (1, 25):
        return "use kubescheduler.config.k8s.io/v1"
    if version >= (1, 23):
        return "use kubescheduler.config.k8s.io/v1beta3"
    return "use the Policy ConfigMap"
