"""`gas check-config`: lint a kube-scheduler configuration that registers gas.

kube-scheduler reports most extender mistakes late or never: a misspelt field stops it at
startup with a terse strict-decoding error, and a wrong TLS or timeout setting shows up only
as failed or silently unchecked calls. This checker knows the rules of the protocol
reference (sections 1.5, 4, 5, 6 and 8) and names each problem with its place in the file.

Accepted inputs: KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, v1beta3, and the
older betas), raw or in a ConfigMap (deploy/any-cluster), the legacy Policy JSON (Kubernetes
<= 1.22), and a Policy wrapped in a ConfigMap under the key ``policy.cfg``. RBAC objects
given alongside a Policy ConfigMap are checked for letting kube-scheduler read it; a
Deployment given alongside a scheduler of gas's own, for agreeing with its configuration.

Modules: `load` (YAML/JSON with line numbers), `values` (formats and value rules),
`checker` (findings and the generic shape checks), `configuration`
(KubeSchedulerConfiguration), `workload` (a scheduler of gas's own, deployed as a workload),
`policy` (the legacy Policy, its ConfigMap and RBAC),
`extenders` (the extender entries and the one that is gas), `command` (`check` and the
command line). Nothing is imported here: `gas` loads `command` to build its parser.
"""
