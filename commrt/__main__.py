import sys

from commrt.cli import main

sys.exit(main())
