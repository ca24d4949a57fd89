"""The data contract: manifest and audit-log schemas, reading, writing, digests and validation, run
directories and locks, plus the bundled source specs, configs, sample, benchmark sets and models.

May import: nothing of HyMo's other packages (every other package reads it).
"""
