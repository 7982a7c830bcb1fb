"""What a run leaves on disk: ``checkpoint`` (atomic, verified checkpoints), ``state_io`` (optimizer, scheduler and
RNG state as safetensors + JSON, no pickles), ``run_dir`` (one run per directory, resume with the run's config).
"""
