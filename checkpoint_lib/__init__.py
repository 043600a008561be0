"""checkpoint_lib."""
