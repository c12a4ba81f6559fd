"""The README and docs/: every relative link and anchor resolves, every doc is reachable
from the README, and the README stays short enough to read first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _anchor(heading: str) -> str:
    # GitHub's rule: lower case, drop punctuation but `-` and `_`, spaces become `-`.
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def _broken(page: Path) -> list[str]:
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z]+:", link):
            continue  # an absolute URL: not checked offline
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        missing_anchor = anchor and path.suffix == ".md" and anchor not in _anchors(path)
        if not path.exists() or missing_anchor:
            broken.append(link)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert _broken(page) == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {
        (ROOT / link.partition("#")[0]).resolve()
        for link in _links(ROOT / "README.md")
        if link.startswith("docs/")
    }
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def test_the_readme_fits_on_a_screen_or_so() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [bad](#nowhere) [gone](missing.md)\n")
    assert _broken(page) == ["#nowhere", "missing.md"]


# A repository path in code spans or commands: deploy/..., scripts/..., docs/...,
# extender-configuration/..., benchmarks/... (a trailing `/` names a folder).
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:deploy|scripts|docs|extender-configuration|benchmarks|tests|gas)"
    r"(?:/[\w.-]+)*/?)"
)
ANY_CLUSTER_GAS_TLS = {"tls.crt", "tls.key", "ca.crt", "client.crt", "client.key"}
KUBEADM_GAS_TLS = {"tls.crt", "tls.key", "ca.crt"}


def _repo_paths(text: str) -> set[str]:
    spans = re.findall(r"`([^`\n]+)`", text) + FENCE.findall(text)
    found = {m for span in spans for m in REPO_PATH.findall(span)}
    # Paths with a placeholder (DIR/...) or a glob are not files to find.
    return {p for p in found if "/" in p.rstrip("/") and not re.search(r"[<>*]", p)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_named_exists(page: Path) -> None:
    """A file that moved (deploy/node-daemonset.yaml went to deploy/base/) leaves no
    instruction pointing at its old place."""
    missing = sorted(p for p in _repo_paths(page.read_text()) if not (ROOT / p).exists())
    assert missing == []


def test_the_check_sees_a_moved_file() -> None:
    assert _repo_paths("apply `deploy/node-daemonset.yaml` or `deploy/base/`") == {
        "deploy/node-daemonset.yaml",
        "deploy/base/",
    }
    assert not (ROOT / "deploy/node-daemonset.yaml").exists()


def _secret_files(block: str, secret: str) -> set[str]:
    command = re.search(rf"create secret generic {secret} (.*)", block)
    assert command is not None, f"no Secret {secret} created"
    return {Path(f).name for f in re.findall(r"--from-file=(\S+)", command.group(1))}


def test_the_kustomize_steps_create_each_ways_secrets_as_its_manifests_mount_them() -> None:
    """docs/kustomize.md's commands, each way's: gas-tls holds what that way's pods read
    from it (kube-scheduler's client certificate too in the any-cluster pod), the webhook's
    Secret is the one its containers mount, and what they apply exists."""
    section = (ROOT / "docs" / "kustomize.md").read_text()
    section = re.sub(r"\\\n\s*", "", section)  # one line per command
    any_cluster = section.split("**Any cluster**", 1)[1].split("**kubeadm**", 1)[0]
    kubeadm = section.split("**kubeadm**", 1)[1]
    assert _secret_files(any_cluster, "gas-tls") == ANY_CLUSTER_GAS_TLS
    assert _secret_files(kubeadm, "gas-tls") == KUBEADM_GAS_TLS
    deployment = (ROOT / "deploy/any-cluster/deployment.yaml").read_text()
    for key in ANY_CLUSTER_GAS_TLS:
        assert f"{{key: {key}, path: {key}}}" in deployment
    assert "secret tls gas-webhook-tls --cert=./gas-certs/webhook.crt" in any_cluster
    assert "secretName: gas-webhook-tls" in deployment
    assert "kubectl apply -k deploy/any-cluster\n" in any_cluster
    assert "rollout status deployment/gas-scheduler" in any_cluster
    assert "name: gas-scheduler\n" in deployment
    assert "kubectl apply -k deploy/\n" in kubeadm
    # The files gas certs writes, in the folder the commands read.
    from gas.tools.certs import FILE_NAMES

    named = set(re.findall(r"\./gas-certs/([\w.-]+)", section))
    assert named <= set(FILE_NAMES) and "gas certs --out ./gas-certs" in section
