import sys

from lagless.cli.main import main

sys.exit(main())
