"""The user surface: the Prefect flows (the whole DAG, one stage, training, CPT), `hymo serve`'s
deployments and the `hymo` command line.

May import: everything else (`tasks`, `hymo_core`, `manifests`); nothing imports it.
"""
