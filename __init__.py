"""policyc: a declarative policy engine for serving ML models at scale."""

__version__ = "0.1.0"
