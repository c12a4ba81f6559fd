"""What both node agents share: `gas node` (the extender way's device plugin) and `gas dra`
(the DRA way's driver) find the same cards, follow them the same way, take the same
common flags and make the same calls about their node. Each agent's own package imports
this one and never the other's.
"""
