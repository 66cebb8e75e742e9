"""The local stack `meshserve up` runs: its topology (topology, and the demo's in demo_topology.yaml), where each
process listens (ports, layout), how each starts (specs), its secrets (credentials), its mesh (mesh), the supervisor
that runs the processes (supervisor), the command's steps (up), and where a running stack is found (state).

Nothing is imported here, so that a client command loading one module (the credentials, the state) loads no more.
"""
