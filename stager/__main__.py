"""``python -m stager``: the same as the ``stager`` command."""

from .cli import main

main()
