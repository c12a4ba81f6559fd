"""`gas check-config`: the shipped configurations pass, and each rule of the protocol
reference (sections 1, 4, 5, 6, 8) is caught with a small bad configuration."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gas import cli

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "extender-configuration"
FIXTURES = ROOT / "tests" / "fixtures"
LINE = re.compile(r"^(ERROR|WARNING) \S+: .+$")

GAS_V1: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "clientConnection": {"kubeconfig": "/etc/kubernetes/scheduler.conf"},
    "extenders": [
        {
            "urlPrefix": "https://gas-extender.gas-system.svc:9001",
            "filterVerb": "scheduler/filter",
            "prioritizeVerb": "scheduler/prioritize",
            "weight": 1,
            "bindVerb": "scheduler/bind",
            "enableHTTPS": True,
            "nodeCacheCapable": True,
            "ignorable": False,
            "httpTimeout": "10s",
            "managedResources": [
                {"name": "gpu.intel.com/i915", "ignoredByScheduler": False},
                {"name": "gpu.intel.com/xe", "ignoredByScheduler": False},
            ],
            "tlsConfig": {
                "insecure": False,
                "serverName": "gas-extender.gas-system.svc",
                "caFile": "/etc/kubernetes/gas/ca.crt",
                "certFile": "/etc/kubernetes/gas/client.crt",
                "keyFile": "/etc/kubernetes/gas/client.key",
            },
        }
    ],
}
# A second, non-gas extender (like Intel's TAS), for rules that span extenders.
TAS: dict[str, Any] = {
    "urlPrefix": "https://tas-service.default.svc:9001",
    "prioritizeVerb": "scheduler/prioritize",
    "filterVerb": "scheduler/filter",
    "weight": 1,
    "enableHTTPS": True,
    "nodeCacheCapable": False,
    "ignorable": True,
    "managedResources": [{"name": "telemetry/scheduling", "ignoredByScheduler": True}],
    "tlsConfig": {
        "caFile": "/etc/kubernetes/tas/ca.crt",
        "certFile": "/etc/kubernetes/tas/client.crt",
        "keyFile": "/etc/kubernetes/tas/client.key",
    },
}


def policy_of(config: dict[str, Any]) -> dict[str, Any]:
    """The same registration in the legacy Policy spelling."""
    extenders = []
    for entry in copy.deepcopy(config["extenders"]):
        if "enableHTTPS" in entry:
            entry["enableHttps"] = entry.pop("enableHTTPS")
        if "httpTimeout" in entry:
            entry["httpTimeout"] = 10_000_000_000
        extenders.append(entry)
    return {"kind": "Policy", "apiVersion": "v1", "extenders": extenders}


def configmap_of(policy: dict[str, Any], key: str = "policy.cfg") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "scheduler-extender-policy", "namespace": "kube-system"},
        "data": {key: json.dumps(policy, indent=2)},
    }


class Result:
    def __init__(self, status: int, out: str, err: str) -> None:
        self.status = status
        self.out = out
        self.err = err
        self.lines = out.splitlines()

    def findings(self, severity: str, path: str) -> list[str]:
        return [line for line in self.lines if line.startswith(f"{severity} {path}: ")]

    def only(self, severity: str, path: str, *words: str) -> str:
        """The one finding at ``path`` of ``severity``, checked to contain ``words``."""
        found = self.findings(severity, path)
        assert len(found) == 1, f"expected one {severity} at {path}, got:\n{self.out}"
        for word in words:
            assert word in found[0], found[0]
        return found[0]


def check(
    capsys: pytest.CaptureFixture[str], *paths: Path | str, version: str | None = None
) -> Result:
    argv = ["check-config", *map(str, paths)]
    if version is not None:
        argv += ["--kubernetesVersion", version]
    status = cli.main(argv)
    captured = capsys.readouterr()
    result = Result(status, captured.out, captured.err)
    assert result.err == ""
    if result.lines != ["OK"]:
        for line in result.lines:
            assert LINE.match(line), line
    has_error = any(line.startswith("ERROR ") for line in result.lines)
    assert status == (1 if has_error else 0)
    return result


def lint(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    document: Any,
    *,
    version: str | None = None,
    name: str = "config.yaml",
) -> Result:
    path = tmp_path / name
    if isinstance(document, str):
        path.write_text(document)
    else:
        path.write_text(yaml.safe_dump(document, sort_keys=False))
    return check(capsys, path, version=version)


def v1(**changes: Any) -> dict[str, Any]:
    """GAS_V1 with fields of its extender replaced (None removes one)."""
    config = copy.deepcopy(GAS_V1)
    for key, value in changes.items():
        if value is None:
            config["extenders"][0].pop(key, None)
        else:
            config["extenders"][0][key] = value
    return config


# ----------------------------------------------------------------------------------------
# Shipped files
# ----------------------------------------------------------------------------------------


def test_shipped_scheduler_config_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    result = check(capsys, CONFIGS / "scheduler-config.yaml")
    assert result.lines == ["OK"] and result.status == 0
    for version in ("1.25", "1.28", "v1.30.2"):
        assert check(capsys, CONFIGS / "scheduler-config.yaml", version=version).lines == ["OK"]


def test_shipped_policy_configmap_and_its_rbac_pass(capsys: pytest.CaptureFixture[str]) -> None:
    policy = CONFIGS / "scheduler-extender-policy-configmap.yaml"
    getter = CONFIGS / "configmap-getter.yaml"
    assert check(capsys, policy, getter, version="1.22").lines == ["OK"]
    assert check(capsys, policy, version="1.21").lines == ["OK"]
    assert check(capsys, getter).lines == ["OK"]
    # Without a version, the one thing to say is which clusters still load a Policy.
    result = check(capsys, policy)
    assert result.status == 0
    result.only("WARNING", "data[policy.cfg].kind", "up to 1.22")
    assert len(result.lines) == 1


def test_shipped_policy_matches_the_v1_configuration() -> None:
    """The two forms register gas the same way, only spelt differently."""
    (configmap,) = yaml.safe_load_all(
        (CONFIGS / "scheduler-extender-policy-configmap.yaml").read_text()
    )
    assert configmap["metadata"] == {
        "name": "scheduler-extender-policy",
        "namespace": "kube-system",
    }
    policy = json.loads(configmap["data"]["policy.cfg"])
    (config,) = yaml.safe_load_all((CONFIGS / "scheduler-config.yaml").read_text())
    assert policy == policy_of(config)
    rbac = list(yaml.safe_load_all((CONFIGS / "configmap-getter.yaml").read_text()))
    assert [doc["kind"] for doc in rbac] == ["Role", "RoleBinding"]
    role, binding = rbac
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["scheduler-extender-policy"],
            "verbs": ["get"],
        }
    ]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"}
    ]


def test_shipped_rbac_matches_the_api_schema() -> None:
    from kubernetes import client

    models: dict[str, Any] = {"Role": client.V1Role, "RoleBinding": client.V1RoleBinding}
    for doc in yaml.safe_load_all((CONFIGS / "configmap-getter.yaml").read_text()):
        parsed = models[doc["kind"]].from_dict(doc)
        assert client.ApiClient().sanitize_for_serialization(parsed) == doc


def test_the_v1_test_base_is_clean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert lint(capsys, tmp_path, GAS_V1).lines == ["OK"]
    assert lint(capsys, tmp_path, policy_of(GAS_V1), version="1.22").lines == ["OK"]
    with_tas = copy.deepcopy(GAS_V1)
    with_tas["extenders"].append(TAS)
    assert lint(capsys, tmp_path, with_tas).lines == ["OK"]


# ----------------------------------------------------------------------------------------
# GAS's own samples (gas-compat.md section 10.2)
# ----------------------------------------------------------------------------------------


def test_gas_policy_configmap_is_recognised_and_its_problems_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = check(capsys, FIXTURES / "gas-policy-configmap.yaml", version="1.22")
    assert result.status == 0  # it loads on 1.22, with these problems:
    base = "data[policy.cfg].extenders[0]"
    result.only("WARNING", f"{base}.apiVersion", 'unknown field "apiVersion"', "(line 17)")
    result.only("WARNING", f"{base}.ignorable", "binder", "no effect on bind")
    result.only("WARNING", f"{base}.tlsConfig", "enableHttps", "caFile")
    result.only("WARNING", f"{base}.managedResources", "gpu.intel.com/xe")
    # GAS has no prioritize verb, and nothing says gas runs binpack or spread: no finding.
    assert result.findings("WARNING", f"{base}.prioritizeVerb") == []
    assert len(result.lines) == 4
    newer = check(capsys, FIXTURES / "gas-policy-configmap.yaml", version="1.28")
    assert newer.status == 1
    newer.only("ERROR", "data[policy.cfg].kind", "removed in Kubernetes 1.23")


def test_gas_scheduler_config_placeholder_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    result = check(capsys, FIXTURES / "gas-scheduler-config.yaml")
    assert result.status == 1
    result.only("ERROR", "apiVersion", "XVERSIONX", "(line 3)")
    result.only("WARNING", "extenders[0].ignorable", "binder")


# ----------------------------------------------------------------------------------------
# One rule at a time
# ----------------------------------------------------------------------------------------


def test_enable_https_spelling_in_v1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = v1(enableHTTPS=None, enableHttps=True)
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[0].enableHttps", "spells it enableHTTPS", "strict decoding")


def test_enable_https_spelling_in_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = policy_of(GAS_V1)
    policy["extenders"][0]["enableHTTPS"] = policy["extenders"][0].pop("enableHttps")
    result = lint(capsys, tmp_path, policy, version="1.22")
    assert result.status == 1
    result.only("ERROR", "extenders[0].enableHTTPS", "spells it enableHttps")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (10, ["duration string", "Policy"]),
        ("10 seconds", ["not a duration"]),
        (True, ["not a duration"]),
    ],
)
def test_http_timeout_is_a_duration_string_in_v1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: Any, words: list[str]
) -> None:
    result = lint(capsys, tmp_path, v1(httpTimeout=value))
    assert result.status == 1
    result.only("ERROR", "extenders[0].httpTimeout", *words[:1])


@pytest.mark.parametrize("value", ["10s", "1m30s", "1.5s", "2h", "0"])
def test_valid_durations(capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str) -> None:
    assert lint(capsys, tmp_path, v1(httpTimeout=value)).lines == ["OK"]


def test_short_and_negative_timeouts_warn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lint(capsys, tmp_path, v1(httpTimeout="300ms")).only(
        "WARNING", "extenders[0].httpTimeout", "0.3s is very short"
    )
    lint(capsys, tmp_path, v1(httpTimeout="-1s")).only(
        "WARNING", "extenders[0].httpTimeout", "no timeout"
    )


def test_http_timeout_is_integer_nanoseconds_in_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = policy_of(GAS_V1)
    policy["extenders"][0]["httpTimeout"] = "10s"
    result = lint(capsys, tmp_path, policy, version="1.22")
    assert result.status == 1
    result.only("ERROR", "extenders[0].httpTimeout", "integer number of nanoseconds")
    policy["extenders"][0]["httpTimeout"] = 10
    result = lint(capsys, tmp_path, policy, version="1.22")
    assert result.status == 0
    result.only("WARNING", "extenders[0].httpTimeout", "nanoseconds", "10000000000")


def test_at_most_one_binder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = copy.deepcopy(GAS_V1)
    config["extenders"].append(dict(TAS, bindVerb="bind"))
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[1].bindVerb", "only one extender can implement bind")


@pytest.mark.parametrize("weight", [0, -1, None])
def test_prioritize_needs_a_positive_weight(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, weight: int | None
) -> None:
    config = copy.deepcopy(GAS_V1)
    tas = copy.deepcopy(TAS)
    if weight is None:
        del tas["weight"]
    else:
        tas["weight"] = weight
    config["extenders"].append(tas)
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[1].weight", "must be > 0 when prioritizeVerb is set")


def test_insecure_with_a_ca_is_a_startup_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = v1()
    config["extenders"][0]["tlsConfig"]["insecure"] = True
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[0].tlsConfig.insecure", "startup error")
    config["extenders"][0]["tlsConfig"].pop("caFile")
    config["extenders"][0]["tlsConfig"]["caData"] = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
    lint(capsys, tmp_path, config).only("ERROR", "extenders[0].tlsConfig.insecure", "caData")


def test_missing_ca_means_an_unchecked_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = v1()
    del config["extenders"][0]["tlsConfig"]["caFile"]
    result = lint(capsys, tmp_path, config)
    assert result.status == 0
    result.only("WARNING", "extenders[0].tlsConfig", "turns OFF the server certificate check")
    config["extenders"][0]["enableHTTPS"] = False
    lint(capsys, tmp_path, config).only("WARNING", "extenders[0].tlsConfig", "system root CAs")
    config["extenders"][0]["tlsConfig"]["insecure"] = True
    lint(capsys, tmp_path, config).only("WARNING", "extenders[0].tlsConfig.insecure", "not checked")


def test_half_a_client_certificate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = v1()
    del config["extenders"][0]["tlsConfig"]["keyFile"]
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[0].tlsConfig", "certFile without keyFile")


def test_inline_data_must_be_base64_pem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = v1()
    tls = config["extenders"][0]["tlsConfig"]
    del tls["caFile"]
    tls["caData"] = "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n"
    result = lint(capsys, tmp_path, config)
    result.only("ERROR", "extenders[0].tlsConfig.caData", "base64")


def test_http_url_prefix_is_not_made_https_by_enable_https(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint(capsys, tmp_path, v1(urlPrefix="http://gas-extender.gas-system.svc:9001"))
    assert result.status == 1
    result.only("ERROR", "extenders[0].urlPrefix", "plain HTTP", "enableHTTPS does not turn")


def test_url_prefix_without_query_string(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = v1(urlPrefix="https://gas-extender.gas-system.svc:9001/?debug=1")
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[0].urlPrefix", "query string")


def test_url_prefix_is_required_and_a_url(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lint(capsys, tmp_path, v1(urlPrefix=None)).only("ERROR", "extenders[0].urlPrefix", "missing")
    lint(capsys, tmp_path, v1(urlPrefix="gas-extender:9001")).only(
        "ERROR", "extenders[0].urlPrefix", "https://"
    )


def test_verbs_without_leading_slash(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, v1(filterVerb="/scheduler/filter"))
    assert result.status == 1
    result.only("ERROR", "extenders[0].filterVerb", "'//'", "'scheduler/filter'")


def test_verbs_must_reach_gas_routes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, v1(bindVerb="bind"))
    result.only("ERROR", "extenders[0].bindVerb", "/bind", "POST /scheduler/bind")
    # A path in urlPrefix counts: .../scheduler + filter is /scheduler/filter.
    config = v1(
        urlPrefix="https://gas-extender.gas-system.svc:9001/scheduler/",
        filterVerb="filter",
        prioritizeVerb="prioritize",
        bindVerb="bind",
    )
    assert lint(capsys, tmp_path, config).lines == ["OK"]


def test_gas_must_filter_and_bind(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, v1(bindVerb=None))
    assert result.status == 1
    result.only("ERROR", "extenders[0].bindVerb", "never binds")
    lint(capsys, tmp_path, v1(filterVerb=None)).only("ERROR", "extenders[0].filterVerb", "full")


def test_prioritize_and_preempt_must_reach_gas(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint(capsys, tmp_path, v1(prioritizeVerb="scheduler/prioritize", weight=1))
    assert result.status == 0
    assert result.findings("WARNING", "extenders[0].prioritizeVerb") == []
    result = lint(capsys, tmp_path, v1(prioritizeVerb="scheduler/priorities", weight=1))
    result.only("WARNING", "extenders[0].prioritizeVerb", "every score would be lost")
    # Left out, as shipped: first fit, gas's default, scores nothing.
    result = lint(capsys, tmp_path, v1(prioritizeVerb=None, weight=None))
    assert result.lines == ["OK"]
    # An empty verb is one left out to kube-scheduler: no call, so no route to check.
    result = lint(capsys, tmp_path, v1(prioritizeVerb="", weight=None))
    assert result.lines == ["OK"]
    assert lint(capsys, tmp_path, v1(preemptVerb="scheduler/preempt")).lines == ["OK"]
    # A failed preempt call aborts preemption, unless the extender is ignorable.
    result = lint(capsys, tmp_path, v1(preemptVerb="scheduler/preemption"))
    assert result.status == 1
    result.only("ERROR", "extenders[0].preemptVerb", "POST /scheduler/preempt", "aborts")
    config = v1(
        urlPrefix="https://gas-extender.gas-system.svc:9001/scheduler",
        filterVerb="filter",
        prioritizeVerb="prioritize",
        bindVerb="bind",
        preemptVerb="preempt",
    )
    assert lint(capsys, tmp_path, config).lines == ["OK"]
    result = lint(capsys, tmp_path, policy_of(v1(preemptVerb="preempt")), version="1.22")
    result.only("ERROR", "extenders[0].preemptVerb", "/preempt, but gas serves")
    # An ignorable extender's failed call is skipped: preemption then ignores the cards.
    # (ignorable draws its own warning on the binder.)
    result = lint(capsys, tmp_path, v1(preemptVerb="preempt", ignorable=True))
    assert result.status == 0
    result.only("WARNING", "extenders[0].preemptVerb", "without gas's card check")


def test_kubeconfig_belongs_in_client_connection(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = v1()
    del config["clientConnection"]
    result = lint(capsys, tmp_path, config)
    assert result.status == 0
    result.only("WARNING", "clientConnection", "ignores its --kubeconfig flag")
    config["kubeconfig"] = "/etc/kubernetes/scheduler.conf"
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "kubeconfig", "clientConnection.kubeconfig")
    config = v1()
    config["clientConnection"] = {"kubeconfig": ""}
    lint(capsys, tmp_path, config).only("WARNING", "clientConnection.kubeconfig", "in-cluster")
    config["clientConnection"] = {"kubeConfig": "/etc/kubernetes/scheduler.conf"}
    lint(capsys, tmp_path, config).only(
        "ERROR", "clientConnection.kubeConfig", "spells it kubeconfig"
    )


def test_unknown_extender_fields_are_strict_decoding_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint(capsys, tmp_path, v1(apiVersion="v1"))
    assert result.status == 1
    result.only("ERROR", "extenders[0].apiVersion", "strict decoding", "GAS's Policy sample")
    config = v1()
    config["extenders"][0]["tlsConfig"]["ca"] = "/x"
    lint(capsys, tmp_path, config).only("ERROR", "extenders[0].tlsConfig.ca", "unknown field")
    config = v1()
    config["extenders"][0]["managedResources"][0]["ignored"] = True
    lint(capsys, tmp_path, config).only(
        "ERROR", "extenders[0].managedResources[0].ignored", "unknown field"
    )


def test_unknown_fields_in_a_policy_are_warnings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = policy_of(GAS_V1)
    policy["extenders"][0]["apiVersion"] = "v1"
    result = lint(capsys, tmp_path, policy, version="1.22")
    assert result.status == 0
    result.only("WARNING", "extenders[0].apiVersion", "not part of the Policy format")


def test_wrong_types_are_decoding_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint(capsys, tmp_path, v1(nodeCacheCapable="true", weight="1"))
    assert result.status == 1
    result.only("ERROR", "extenders[0].nodeCacheCapable", "true or false", "a string")
    result.only("ERROR", "extenders[0].weight", "an integer")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("i915", "domain prefix"),
        ("kubernetes.io/gpu", "native"),
        ("requests.gpu.intel.com/i915", "requests."),
        ("GPU.intel.com/i915", "DNS subdomain"),
        ("gpu.intel.com/-i915", "not a valid name"),
    ],
)
def test_managed_resources_are_extended_resource_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, words: str
) -> None:
    config = v1()
    config["extenders"][0]["managedResources"].append({"name": name})
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[0].managedResources[2].name", "not a valid extended", words)


def test_managed_resources_are_unique_across_extenders(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = copy.deepcopy(GAS_V1)
    tas = copy.deepcopy(TAS)
    tas["managedResources"].append({"name": "gpu.intel.com/xe"})
    config["extenders"].append(tas)
    result = lint(capsys, tmp_path, config)
    assert result.status == 1
    result.only("ERROR", "extenders[1].managedResources[1].name", "already managed at extenders[0]")


def test_gas_must_manage_i915(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, v1(managedResources=[{"name": "gpu.intel.com/xe"}]))
    assert result.status == 1
    result.only("ERROR", "extenders[0].managedResources", "gpu.intel.com/i915 is missing")
    result = lint(capsys, tmp_path, v1(managedResources=[{"name": "gpu.intel.com/i915"}]))
    assert result.status == 0
    result.only("WARNING", "extenders[0].managedResources", "gpu.intel.com/xe is missing")
    result = lint(capsys, tmp_path, v1(managedResources=None))
    result.only("WARNING", "extenders[0].managedResources", "every pod")


def test_node_cache_capable_false_warns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for value in (False, None):
        result = lint(capsys, tmp_path, v1(nodeCacheCapable=value))
        assert result.status == 0
        result.only("WARNING", "extenders[0].nodeCacheCapable", "large bodies")


def test_ignorable_binder_warns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, v1(ignorable=True))
    assert result.status == 0
    result.only("WARNING", "extenders[0].ignorable", "no effect on bind", "skip gas's filter")


def test_no_extenders(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = v1()
    config["extenders"] = []
    lint(capsys, tmp_path, config).only("ERROR", "extenders", "gas is not registered")
    config["extenders"] = [TAS]
    lint(capsys, tmp_path, config).only("ERROR", "extenders", "no extender looks like gas")
    config = v1()
    config["profiles"] = [{"schedulerName": "default-scheduler", "extenders": GAS_V1["extenders"]}]
    del config["extenders"]
    result = lint(capsys, tmp_path, config)
    result.only("ERROR", "profiles[0].extenders", "top-level field")


# ----------------------------------------------------------------------------------------
# Versions
# ----------------------------------------------------------------------------------------


def test_v1beta3_is_accepted_where_kubernetes_loads_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = dict(GAS_V1, apiVersion="kubescheduler.config.k8s.io/v1beta3")
    assert lint(capsys, tmp_path, config, version="1.24").lines == ["OK"]
    lint(capsys, tmp_path, config, version="1.27").only("WARNING", "apiVersion", "deprecated")
    lint(capsys, tmp_path, config, version="1.29").only(
        "ERROR", "apiVersion", "removed in Kubernetes 1.29"
    )
    lint(capsys, tmp_path, config, version="1.22").only("ERROR", "apiVersion", "added in 1.23")
    result = lint(capsys, tmp_path, config)
    assert result.status == 0
    result.only("WARNING", "apiVersion", "1.23 to 1.28")


def test_v1_needs_kubernetes_1_25(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lint(capsys, tmp_path, GAS_V1, version="1.24").only("ERROR", "apiVersion", "added in 1.25")


def test_policy_is_removed_in_1_23(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, policy_of(GAS_V1), version="1.23")
    assert result.status == 1
    result.only(
        "ERROR", "kind", "removed in Kubernetes 1.23", "kubescheduler.config.k8s.io/v1beta3"
    )


def test_bad_kubernetes_version_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(GAS_V1))
    status = cli.main(["check-config", str(path), "--kubernetesVersion", "latest"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "1.28" in err


# ----------------------------------------------------------------------------------------
# ConfigMap, RBAC and file handling
# ----------------------------------------------------------------------------------------


def test_policy_configmap_needs_the_policy_cfg_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint(capsys, tmp_path, configmap_of(policy_of(GAS_V1), key="policy.json"))
    assert result.status == 1
    result.only("ERROR", "data", "only the key policy.cfg")


def test_policy_configmap_outside_kube_system_warns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    configmap = configmap_of(policy_of(GAS_V1))
    configmap["metadata"]["namespace"] = "default"
    result = lint(capsys, tmp_path, configmap, version="1.22")
    result.only("WARNING", "metadata.namespace", "--policy-configmap-namespace")


def test_rbac_given_with_the_configmap_must_let_the_scheduler_read_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    configmap = tmp_path / "cm.yaml"
    configmap.write_text(yaml.safe_dump(configmap_of(policy_of(GAS_V1))))
    docs = list(yaml.safe_load_all((CONFIGS / "configmap-getter.yaml").read_text()))
    docs[1]["subjects"][0]["name"] = "system:kube-controller-manager"
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(yaml.safe_dump_all(docs))
    result = check(capsys, configmap, rbac, version="1.22")
    assert result.status == 1
    result.only("ERROR", f"{configmap}:metadata.name", "system:kube-scheduler")
    # A ClusterRole bound cluster-wide works as well.
    docs = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "cm"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "cm"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cm",
            },
            "subjects": [{"kind": "User", "name": "system:kube-scheduler"}],
        },
    ]
    rbac.write_text(yaml.safe_dump_all(docs))
    assert check(capsys, configmap, rbac, version="1.22").lines == ["OK"]


def test_duplicate_fields_are_strict_decoding_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = (
        (CONFIGS / "scheduler-config.yaml")
        .read_text()
        .replace("    ignorable: false\n", "    ignorable: false\n    ignorable: true\n")
    )
    result = lint(capsys, tmp_path, text)
    assert result.status == 1
    line = text.splitlines().index("    ignorable: true") + 1
    result.only("ERROR", "extenders[0].ignorable", "duplicate field", f"(line {line})")


def test_findings_carry_line_numbers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = (
        (CONFIGS / "scheduler-config.yaml")
        .read_text()
        .replace("enableHTTPS: true", "enableHttps: true")
    )
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "enableHttps" in row)
    lint(capsys, tmp_path, text).only("ERROR", "extenders[0].enableHttps", f"(line {line})")


def test_policy_as_tab_indented_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = json.dumps(policy_of(GAS_V1), indent="\t")
    assert lint(capsys, tmp_path, text, version="1.22", name="policy.json").lines == ["OK"]


def test_not_a_scheduler_configuration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = lint(capsys, tmp_path, {"apiVersion": "v1", "kind": "Service"})
    assert result.status == 1
    assert "no KubeSchedulerConfiguration (raw or in a ConfigMap), Policy or Policy" in result.out
    result = lint(capsys, tmp_path, "extenders: [\n")
    assert result.status == 1
    assert result.lines[0].startswith(f"ERROR {tmp_path / 'config.yaml'}: not valid YAML")


def test_unreadable_file_is_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status = cli.main(["check-config", str(tmp_path / "missing.yaml")])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and "missing.yaml" in captured.err


# ------------------------------------------------------------------ a scheduler of gas's own

ANY_CLUSTER = ROOT / "deploy" / "any-cluster"
PROFILE_CONFIGMAP = ANY_CLUSTER / "scheduler-config.yaml"
PROFILE_DEPLOYMENT = ANY_CLUSTER / "deployment.yaml"


def profile() -> dict[str, Any]:
    """The any-cluster scheduler's configuration, as deploy/ ships it."""
    (config_map,) = yaml.safe_load_all(PROFILE_CONFIGMAP.read_text())
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def wrapped(config: dict[str, Any]) -> str:
    """``config`` in a ConfigMap, as a block scalar (the form deploy/ uses)."""
    body = yaml.safe_dump(config, sort_keys=False)
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    return (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gas-scheduler-config\n"
        f"  namespace: gas-system\ndata:\n  config.yaml: |\n{indented}"
    )


def deployment(**flags: str) -> dict[str, Any]:
    """deploy/any-cluster's Deployment with some container flags changed (`gas_port=9101`,
    `webhook_schedulerName=x`), or the Deployment's own fields (`replicas`, `namespace`)."""
    doc: dict[str, Any] = yaml.safe_load(PROFILE_DEPLOYMENT.read_text())
    for key, value in flags.items():
        if key == "replicas":
            doc["spec"]["replicas"] = int(value)
            continue
        if key == "namespace":
            doc["metadata"]["namespace"] = value
            continue
        container, _, flag = key.partition("_")
        (target,) = [
            c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == container
        ]
        args = [a for a in target["args"] if not a.startswith(f"--{flag}=")]
        if value:
            args.append(f"--{flag}={value}")
        target["args"] = args
    return doc


def lint_profile(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    config: dict[str, Any],
    workload: dict[str, Any] | None = None,
) -> Result:
    paths = [tmp_path / "scheduler-config.yaml"]
    paths[0].write_text(wrapped(config))
    if workload is not None:
        paths.append(tmp_path / "deployment.yaml")
        paths[1].write_text(yaml.safe_dump(workload, sort_keys=False))
    return check(capsys, *paths)


def test_shipped_profile_passes_alone_with_its_deployment_and_with_all_of_deploy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert check(capsys, PROFILE_CONFIGMAP).lines == ["OK"]
    assert check(capsys, PROFILE_CONFIGMAP, PROFILE_DEPLOYMENT).lines == ["OK"]
    assert check(capsys, *sorted(ANY_CLUSTER.glob("*.yaml"))).lines == ["OK"]
    # The same configuration as a file of its own (kube-scheduler --config).
    raw = tmp_path / "raw.yaml"
    raw.write_text(yaml.safe_dump(profile()))
    assert check(capsys, raw).lines == ["OK"]


def test_a_scoring_policy_needs_the_prioritize_verb(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert "prioritizeVerb" not in profile()["extenders"][0]  # shipped for first fit
    for policy in ("binpack", "spread"):
        result = lint_profile(capsys, tmp_path, profile(), deployment(gas_policy=policy))
        assert result.status == 0
        result.only(
            "WARNING",
            f"{tmp_path}/scheduler-config.yaml:data[config.yaml].extenders[0].prioritizeVerb",
            f"gas runs --policy {policy}",
            "GPUPolicyNotScored",
            # Relative to this urlPrefix, which ends in /scheduler.
            "set prioritizeVerb: 'prioritize' and weight: 1",
        )
        assert len(result.lines) == 1
    scored = profile()
    scored["extenders"][0].update(prioritizeVerb="prioritize", weight=1)
    result = lint_profile(capsys, tmp_path, scored, deployment(gas_policy="binpack"))
    assert result.lines == ["OK"]
    first_fit = lint_profile(capsys, tmp_path, profile(), deployment(gas_policy="first-fit"))
    assert first_fit.lines == ["OK"]


def test_profile_findings_are_placed_in_the_configmap_at_their_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = PROFILE_CONFIGMAP.read_text().replace(
        '- name: "gpu.intel.com/i915"', '- name: "gpu.intel.com/i9l5"'
    )
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "i9l5" in row)
    path = tmp_path / "scheduler-config.yaml"
    path.write_text(text)
    result = check(capsys, path)
    finding = result.only(
        "ERROR", "data[config.yaml].extenders[0].managedResources", "gpu.intel.com/i915 is missing"
    )
    assert finding.endswith(f"(line {line - 1})")  # the list's line, just above the name


def scheduler_image(doc: dict[str, Any], image: str) -> dict[str, Any]:
    (scheduler,) = [
        c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"
    ]
    scheduler["image"] = image
    return doc


def test_the_scheduler_image_is_held_to_the_clusters_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def lint(image: str, version: str | None) -> Result:
        config = tmp_path / "scheduler-config.yaml"
        config.write_text(wrapped(profile()))
        workload = tmp_path / "deployment.yaml"
        workload.write_text(yaml.safe_dump(scheduler_image(deployment(), image)))
        return check(capsys, config, workload, version=version)

    image = "registry.k8s.io/kube-scheduler:v1.33.2"
    # Its own version, or one minor older (the skew policy's bound), or no version given.
    for version in ("1.33", "v1.33.2-eks-0a1b2c3", "1.34", None):
        assert lint(image, version).lines == ["OK"], version
    newer = lint(image, "1.32")
    where = f"{tmp_path}/scheduler-config.yaml:data[config.yaml]"
    newer.only("ERROR", where, "v1.33, newer than the cluster (1.32)", "no pod", "v1.32.x")
    assert newer.status == 1
    older = lint(image, "1.37")
    older.only("WARNING", where, "v1.33, more than one minor version older", "(1.37)", "v1.37.x")
    assert older.status == 0
    # A tag that is no version (a digest, latest, a registry's port) says nothing.
    for other in (
        "registry.local:5000/kube-scheduler@sha256:" + "0" * 64,
        "registry.local:5000/kube-scheduler:latest",
        "registry.local:5000/kube-scheduler",
    ):
        assert lint(other, "1.28").lines == ["OK"], other


def test_profile_the_webhook_does_not_name_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = lint_profile(
        capsys, tmp_path, profile(), deployment(webhook_schedulerName="gpu-scheduler")
    )
    result.only(
        "ERROR",
        f"{tmp_path}/scheduler-config.yaml:data[config.yaml].profiles",
        "'gpu-scheduler'",
        "Pending",
    )
    # Alone, a profile of another name is a warning: the webhook may be told its name.
    config = profile()
    config["profiles"][0]["schedulerName"] = "gpu-scheduler"
    result = lint_profile(capsys, tmp_path, config)
    result.only("WARNING", "data[config.yaml].profiles", "--schedulerName")
    assert result.status == 0


def test_leader_election_off_is_an_error_when_gas_follows_the_lease(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = profile()
    config["leaderElection"] = {"leaderElect": False}
    where = f"{tmp_path}/scheduler-config.yaml:data[config.yaml].leaderElection.leaderElect"
    lint_profile(capsys, tmp_path, config, deployment()).only("ERROR", where, "503")
    # gas not following a Lease, but two replicas: two binders with books of their own.
    two = deployment(gas_schedulerLease="", replicas="2")
    lint_profile(capsys, tmp_path, config, two).only("ERROR", where, "same card")
    one = deployment(gas_schedulerLease="", replicas="1")
    assert lint_profile(capsys, tmp_path, config, one).lines == ["OK"]
    alone = lint_profile(capsys, tmp_path, config)
    alone.only("WARNING", "data[config.yaml].leaderElection.leaderElect", "single replica")


def test_the_default_schedulers_lease_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = profile()
    config["leaderElection"] = {"leaderElect": True}
    result = lint_profile(capsys, tmp_path, config)
    result.only(
        "ERROR", "data[config.yaml].leaderElection.resourceName", "missing", "schedules nothing"
    )
    config["leaderElection"] = {
        "leaderElect": True,
        "resourceName": "kube-scheduler",
        "resourceNamespace": "kube-system",
    }
    result = lint_profile(capsys, tmp_path, config)
    result.only("ERROR", "data[config.yaml].leaderElection.resourceName", "default scheduler's")


def test_the_lease_must_be_the_one_gas_follows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = profile()
    config["leaderElection"]["resourceName"] = "my-scheduler"
    result = lint_profile(capsys, tmp_path, config, deployment())
    result.only(
        "ERROR",
        f"{tmp_path}/scheduler-config.yaml:data[config.yaml].leaderElection.resourceName",
        "'my-scheduler'",
        "'gas-scheduler'",
    )
    # In another namespace than gas's.
    config = profile()
    result = lint_profile(capsys, tmp_path, config, deployment(namespace="gpu"))
    result.only(
        "ERROR",
        f"{tmp_path}/scheduler-config.yaml:data[config.yaml].leaderElection.resourceNamespace",
        "'gpu'",
    )
    # gas told where to read it: then that namespace counts.
    moved = deployment(namespace="gpu", gas_leaderElectNamespace="gas-system")
    assert lint_profile(capsys, tmp_path, config, moved).lines == ["OK"]
    # No namespace at all: kube-system, where the any-cluster Role grants nothing.
    del config["leaderElection"]["resourceNamespace"]
    result = lint_profile(capsys, tmp_path, config)
    result.only("WARNING", "data[config.yaml].leaderElection.resourceNamespace", "kube-system")


def test_gas_is_called_on_loopback_at_its_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = profile()
    config["extenders"][0]["urlPrefix"] = "https://gas-extender.gas-system.svc:9001/scheduler"
    where = "extenders[0].urlPrefix"
    result = lint_profile(capsys, tmp_path, config, deployment())
    result.only(
        "ERROR",
        f"{tmp_path}/scheduler-config.yaml:data[config.yaml].{where}",
        "not loopback",
        "503",
    )
    lint_profile(capsys, tmp_path, config).only("WARNING", f"data[config.yaml].{where}", "loopback")
    result = lint_profile(capsys, tmp_path, profile(), deployment(gas_port="9101"))
    result.only("ERROR", f"{tmp_path}/scheduler-config.yaml:data[config.yaml].{where}", "9101")
    result = lint_profile(capsys, tmp_path, profile(), deployment(gas_host="10.0.0.5"))
    result.only("ERROR", f"{tmp_path}/scheduler-config.yaml:data[config.yaml].{where}", "10.0.0.5")


def test_the_default_scheduler_calling_gas_on_loopback_is_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = copy.deepcopy(GAS_V1)
    config["extenders"][0]["urlPrefix"] = "https://127.0.0.1:9001"
    result = lint(capsys, tmp_path, config)
    result.only("WARNING", "extenders[0].urlPrefix", "Service")
    # A kubeadm configuration keeps its kubeconfig warning; a scheduler of gas's own runs
    # on its ServiceAccount.
    del config["clientConnection"]
    assert lint(capsys, tmp_path, config).findings("WARNING", "clientConnection")
    assert profile()["clientConnection"]["kubeconfig"] == ""
    config = profile()
    del config["clientConnection"]
    assert lint_profile(capsys, tmp_path, config).lines == ["OK"]


def test_a_configmap_holding_something_else_than_a_configuration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = wrapped(profile()).replace(
        "kind: KubeSchedulerConfiguration", "kind: KubeSchedulerConfiguration\n    - x"
    )
    result = lint(capsys, tmp_path, text)
    result.only("ERROR", "data[config.yaml]", "not valid YAML")


def test_an_ip_urlprefix_without_server_name_needs_that_ip_in_the_certificate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = copy.deepcopy(GAS_V1)
    del config["extenders"][0]["tlsConfig"]["serverName"]
    config["extenders"][0]["urlPrefix"] = "https://10.96.0.50:9001"
    lint(capsys, tmp_path, config).only("WARNING", "extenders[0].tlsConfig", "gas certs --ip")
    # The loopback address is in every certificate `gas certs` makes.
    config = profile()
    assert "serverName" not in config["extenders"][0]["tlsConfig"]
    assert lint_profile(capsys, tmp_path, config).lines == ["OK"]


def test_the_tls_files_must_be_in_kube_schedulers_container(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    where = f"{tmp_path}/scheduler-config.yaml:data[config.yaml].extenders[0].tlsConfig"
    config = profile()
    config["extenders"][0]["tlsConfig"]["caFile"] = "/etc/gas/ca.crt"
    result = lint_profile(capsys, tmp_path, config, deployment())
    result.only("ERROR", f"{where}.caFile", "/etc/gas/ca.crt", "no volume is mounted at /etc/gas")
    # A file the mounted Secret's items leave out.
    config = profile()
    config["extenders"][0]["tlsConfig"]["keyFile"] = "/etc/kubernetes/gas/tls.key"
    result = lint_profile(capsys, tmp_path, config, deployment())
    result.only("ERROR", f"{where}.keyFile", "holds only ca.crt, client.crt, client.key")
    # Without the Deployment nothing is known of the mounts.
    assert lint_profile(capsys, tmp_path, config).lines == ["OK"]
