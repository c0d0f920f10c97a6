"""The ground floor: meshes, hosts, checkpoints, run files, compile counts.

Owns what every layer above stands on and nothing about the model or the
algorithm: the device mesh and shardings from logical axes (`mesh`),
multi-host row slicing and agreements (`multihost`), the one
layout-independent checksum (`checksum`), the checked layout change
(`resharder`) and reading compiled HLO (`hlo`), checkpoints that survive
preemption (`checkpoint`, `checkpoint_format`), a run directory's files and
who may write them (`run_dir`), metrics rows and TensorBoard events
(`metrics`), loop progress for terminals and log files (`progress`),
backend compile counting (`compiles`) and the commands' exit codes
(`exit_codes`).

May import: nothing of ada_jax outside this package (a test checks).
"""
