"""`python -m policyc.modelserver --model [NAME=]PATH … --grpc-port P --http-port Q`."""

from __future__ import annotations

import sys

from .command import main

sys.exit(main())
