"""Runtime shared by every meshserve service."""
