"""What the labs measure, kept apart from the operators (one submodule per subject)."""
