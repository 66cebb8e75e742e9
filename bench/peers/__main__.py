"""`python -m bench.peers`: fraud_mlp on MLServer, KServe, meshserve and the floor (bench.peers.servers)."""

import sys

from bench.peers.servers import main

sys.exit(main())
