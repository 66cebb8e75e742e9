"""The `meshserve` command line: run the local stack, send inference requests, drive demo traffic."""
