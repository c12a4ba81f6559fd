"""`gas inspect` (also the kubectl plugin `kubectl gas`): GPU allocation per node and card.

Reads nodes and pods from the API server and recomputes, from pod annotations alone and
with the ledger's own code (`gas.core.holdings.observe_pod`,
`gas.tools.audit.usage_from_pods`), what
every card has given out: the same numbers a freshly started gas would hold. It needs no
running gas, only read access to nodes and pods; `--extender URL` also asks a running gas
for its ledger (`/debug/ledger`) and reports where the two disagree (drift).

Nodes are shown when they have GPU labels or `gpu.intel.com/*` allocatable, or when a pod
holds cards on them; other nodes are only counted. Rows are sorted by node, then card in
numeric order. Memory resources are shown in binary units (`5Gi`), others as integers.

Problems (exit status 1): a card given out beyond its capacity or held on a card the node
does not list (gas never does either; seeing one means drift or a hand-made annotation),
a `gas-container-cards` or `gas-container-tiles` annotation that cannot be read (gas then
counts the cards it names, or the whole node, as full), drift from `--extender`, and node
drift: a container the node side handed other cards (`gas-node-cards`, written by `gas
node`) than gas decided (`gas-container-cards`), or an unreadable `gas-node-cards`. Once a
node side reports, the table gets a HANDED-OUT column beside PODS (gas's decision) and the
STATUS `drift` on each card a hand-out and the decision disagree on.
Warnings (shown, exit status unchanged): a GPU node whose labels or allocatable cannot be
read (gas sends it no GPU pod), and a bound GPU pod without gas's annotation (not
accounted by gas: it was scheduled around the extender).

Exit status: 0 all well, 1 problems found, 2 the cluster or the extender could not be read
or `--node` names no node.

`-o json` prints one object; keys are stable, amounts are exact integers (bytes for memory):

    {
      "nodes": [                      # sorted by name
        {
          "name": "node-a",
          "problem": null,            # why the node's labels/allocatable cannot be read
          "blocked_by": [],           # pods whose unreadable annotation blocks the whole node
          "cards": [                  # numeric card order
            {
              "name": "card0",
              "listed": true,         # false: pods hold it but the node's labels omit it
              "over_capacity": false,
              "blocked": false,       # counted as full by gas (see blocked_by)
              "resources": {"i915": {"allocated": 1, "capacity": 1}, ...},
              "pods": ["default/train"],
              "blocked_by": [],       # pods whose unreadable annotation names this card
              "handed_out": ["default/train"],  # pods the node side gave this card to
              "node_drift": []        # pods whose hand-out and gas's decision differ here
            }
          ]
        }
      ],
      "totals": {
        "nodes": 3, "cards": 7, "pods": 5,
        "nodes_without_gpus": 1,      # listed by the API server but not shown
        "resources": {"i915": {"allocated": 4, "capacity": 7}, ...}
      },
      "problems": [                   # each: kind, node, card, pod (null when n/a), message
        {"kind": "over_capacity" | "annotation" | "drift" | "node_drift", ...}
      ],
      "warnings": [{"kind": "node" | "unaccounted", ...}],
      "drift": null,                  # without --extender; else {"url": ..., "differences": [...]}
      "placeable": {                  # only with --placeable: more pods of each size that fit
        "nodes": {"node-a": {"quarter-card": 4, "half-card": 2, "one-card": 1, "two-cards": 0}},
        "total": {"quarter-card": 4, ...}   # each size counted alone (gas.core.scoring)
      }
    }

Resource names drop the `gpu.intel.com/` prefix: `i915`, `memory.max`, `millicores`, ...

Modules: `report` (the allocation report, pure), `handout` (what the node side handed out
next to gas's decision, pure), `render` (table and JSON), `read` (the
cluster and a running gas's ledger), `command` (`gas inspect`, `kubectl_main` for
`kubectl gas`). Nothing is imported here: `gas` loads `command` to build its parser.
"""
