"""The decision log (``DECISION_LOG``) and ``ferryman replay``: logged requests decided again
by the engine on a virtual clock, per rule and between two configurations."""
