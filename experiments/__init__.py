"""The experiment files (one per paper table), installed as `mpx.experiments`."""
