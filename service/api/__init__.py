"""The REST API of the control plane (``service.api.app.create_app``)."""
