"""A real API process for the tests (see ``service.api.process``)."""

from service.api.process import LiveServer, free_port

__all__ = ["LiveServer", "free_port"]
