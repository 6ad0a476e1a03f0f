"""Where a ladder's chains run when not here: `--on slurm` (one job array task per chain) and `--on k8s`
(one batch/v1 Job per chain), and the node-side entry both run (`python -m servimg.placement.remote`),
whose outcomes `remote.collect` reads back into the local run's receipt."""
