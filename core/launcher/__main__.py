"""``python -m launcher``: the same as the ``launcher`` command."""

from launcher.cli import main

if __name__ == "__main__":
    main()
