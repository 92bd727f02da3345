"""``python -m pubsubclub``: same as the ``pubsubclub`` command."""

from pubsubclub.cli import main

raise SystemExit(main())
