import sys

from bastion.cli import main

sys.exit(main())
