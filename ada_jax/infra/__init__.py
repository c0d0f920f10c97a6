"""The ground floor: meshes, hosts, checkpoints, run files, compile counts.

Owns what every layer above stands on and nothing about the model or the
algorithm: what differs by platform (`platforms`), TPU pods by accelerator
type and their real devices from libtpu without a chip (`tpu_pods`), the
device mesh and shardings from logical axes (`mesh`),
multi-host row slicing and agreements (`multihost`), the one
layout-independent checksum (`checksum`), the checked layout change
(`resharder`) and reading compiled HLO (`hlo`), checkpoints that survive
preemption (`checkpoint`, `checkpoint_format`), a run directory's files and
who may write them (`run_dir`, the one-writer `lease`), metrics rows and TensorBoard events
(`metrics`), loop progress for terminals and log files (`progress`),
backend compile counting (`compiles`) and the commands' exit codes
(`exit_codes`).

May import: nothing of ada_jax outside this package (a test checks).
"""
