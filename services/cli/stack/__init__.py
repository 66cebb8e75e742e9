"""The local stack `meshserve up` runs: its topology (topology, the demo topology file), where each process listens
(layout), how each starts (specs), its secrets (credentials), the supervisor that runs them (supervisor), and the
command's steps (up).

Nothing is imported here, so that a client command loading one module (say the credentials) does not load the rest.
"""
