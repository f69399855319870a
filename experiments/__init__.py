"""Studies of the arithmetic world (headroom, verifier separation, reward agreement, name use, gain
by kind, StepCo's flags). Each imports the toolkit; no toolkit package imports them, and the wheel
does not ship them. Run one as `python -m experiments.NAME` (or `python experiments/NAME.py`)."""
