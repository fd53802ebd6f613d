"""``python -m training_toolkit`` is ``training-toolkit``."""

from training_toolkit.cli import main

raise SystemExit(main())
