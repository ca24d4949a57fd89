"""More than one process: the process group and collectives (process_group), FSDP2 per block
(parallelize), and the torchrun launcher the CLI and the pretrain stage supervise (launch).

May import: `hymo_core.models`, `hymo_core.train` (configs).
"""
