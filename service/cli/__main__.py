"""``python -m service.cli`` runs the ``orthoplex`` command line."""

from service.cli.main import app

app()
