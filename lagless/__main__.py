import sys

from lagless.signals import interrupt_on_signals

interrupt_on_signals()  # before the command's modules load (cli/main.py)

from lagless.cli.main import main  # noqa: E402

sys.exit(main())
