"""The capacity-planning report: studies, sentences computed from data, figures (the only matplotlib user)."""
