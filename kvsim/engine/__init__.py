"""Time: the builder (scenario → engine parts, resolved once), the arrival clock, the step loop and its recorder.
The only SimPy user."""
