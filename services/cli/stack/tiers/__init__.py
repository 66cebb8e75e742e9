"""Two tiers on one machine (`meshserve up --topology edge_cloud`): an edge and a cloud stack, their layouts
(layout.py) and how they start and stop together (up.py)."""
