"""How long one engine step takes: one interface (`step_time(plan)`), the roofline and calibrated models,
the `StepPlan` they price, and measured profiles with their importers."""
