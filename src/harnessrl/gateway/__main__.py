"""``python -m harnessrl.gateway``: serve the gateway without the typer CLI (see ``server.main``)."""

from harnessrl.gateway.server import main

main()
