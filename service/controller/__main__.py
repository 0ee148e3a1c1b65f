"""``python -m service.controller``: run the controller loop alone (see ``runner.main``)."""

from service.controller.runner import main

if __name__ == "__main__":
    main()
