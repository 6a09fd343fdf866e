"""Training scripts for the two-GPU tests (issue 16): tests/gpu/test_two_gpus_training.py runs them in subprocesses."""
