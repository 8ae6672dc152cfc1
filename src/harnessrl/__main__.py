"""``python -m harnessrl`` is the ``harnessrl`` command."""

from harnessrl.cli.main import main

main()
