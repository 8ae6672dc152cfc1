"""``python -m harnessrl.gateway``: serve the gateway without the typer CLI (see ``server.main``).

An entry point composes the app, so it is the one module of the package that may mount the
dashboard (``/ui``) as the ``harnessrl gateway`` command does; nothing imports it.
"""

from harnessrl.dashboard import gateway_dashboard
from harnessrl.gateway.server import main

main(extra_routes=[gateway_dashboard])
