"""meshserve beside its peers: fraud_mlp on MLServer and KServe (servers), the fraud pipeline on Ray Serve (pipeline).

The shims run inside the peers' own virtualenvs, so this package imports nothing when it is imported."""
